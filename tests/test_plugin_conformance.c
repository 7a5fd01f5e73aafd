/*
 * test_plugin_conformance.c — the loader against tests/plugins/: every deliberately broken plugin is rejected with
 * its exact one-line reason, the good ones load and are probed, nothing stops at the first bad plugin, and nothing
 * is ever unloaded. Also discovery: folder scans, explicit paths, missing folders and paths, duplicates.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "errors.h"
#include "registry.h"
#include "test_registry_support.h"
#include "check_run.h"

/* Offsets the messages quote; the ABI layout test pins them, this only keeps the strings below honest. */
_Static_assert(BERTH_SIZE_TO(berth_plugin_desc, vtable) == 56, "descriptor size quoted below");
_Static_assert(BERTH_SIZE_TO(berth_backend_vtable, buffer_fill) == 144, "backend vtable size quoted below");

struct expect {
    const char *file;
    enum plugin_state state;
    int kind;
    const char *name;   /* NULL: the descriptor was not (fully) read */
    const char *reason; /* exact; "@DIR@" stands for the test plugin folder, "@DLERROR@" for dlopen's own text */
};

/* Every file of tests/plugins/, in the order the loader must list them (byte order of the file names). */
static const struct expect expected[] = {
    {"backend_abi06.so", PLUGIN_REJECTED, 0, NULL, "ABI major mismatch: plugin ABI 0.6, host ABI 1.0"},
    {"backend_abimajor.so", PLUGIN_REJECTED, 0, NULL, "ABI major mismatch: plugin ABI 2.0, host ABI 1.0"},
    {"backend_badkind.so", PLUGIN_REJECTED, 0, "badkind", "unknown plugin kind 7"},
    {"backend_badmagic.so", PLUGIN_REJECTED, 0, NULL, "bad magic 0xdeadbeef (expected 0x42525448)"},
    {"backend_entrynull.so", PLUGIN_REJECTED, 0, NULL,
     "berth_plugin_entry returned NULL (the plugin does not serve host ABI 1.0)"},
    {"backend_initfail.so", PLUGIN_LOADED, BERTH_PLUGIN_BACKEND, "initfail", ""},
    {"backend_newminor.so", PLUGIN_LOADED, BERTH_PLUGIN_BACKEND, "newminor",
     "plugin ABI 1.9 is newer than host ABI 1.0 (accepted)"},
    {"backend_newminor_svc.so", PLUGIN_REJECTED, BERTH_PLUGIN_BACKEND, "newminor_svc",
     "requires host service bit 4 (0x10) that host ABI 1.0 does not provide"},
    {"backend_noattn.so", PLUGIN_LOADED, BERTH_PLUGIN_BACKEND, "noattn", ""},
    {"backend_nosymbol.so", PLUGIN_REJECTED, 0, NULL, "not a berth plugin: no berth_plugin_entry symbol"},
    {"backend_nullmember.so", PLUGIN_REJECTED, BERTH_PLUGIN_BACKEND, "nullmember",
     "backend vtable member 'buffer_alloc' is NULL"},
    {"backend_nullvtable.so", PLUGIN_REJECTED, BERTH_PLUGIN_BACKEND, "nullvtable", "backend vtable is NULL"},
    {"backend_probefail.so", PLUGIN_REJECTED, BERTH_PLUGIN_BACKEND, "probefail",
     "probe failed: probefail: driver not responding"},
    {"backend_smalldesc.so", PLUGIN_REJECTED, 0, NULL,
     "descriptor struct_size 16 is too small (ABI 1.0 needs at least 56)"},
    {"backend_smallvtable.so", PLUGIN_REJECTED, BERTH_PLUGIN_BACKEND, "smallvtable",
     "backend vtable struct_size 16 is too small (ABI 1.0 needs at least 144)"},
    {"backend_testcpu.so", PLUGIN_LOADED, BERTH_PLUGIN_BACKEND, "testcpu", ""},
    {"backend_testcpu_twin.so", PLUGIN_REJECTED, BERTH_PLUGIN_BACKEND, "testcpu",
     "duplicate backend name 'testcpu' (already loaded from @DIR@/backend_testcpu.so)"},
    {"backend_zerodev.so", PLUGIN_LOADED, BERTH_PLUGIN_BACKEND, "zerodev",
     "no devices: 0 TEST devices: no test accelerator here"},
    {"model_nullforward.so", PLUGIN_REJECTED, BERTH_PLUGIN_MODEL, "nullforward",
     "model vtable member 'forward' is NULL"},
    {"model_picky.so", PLUGIN_LOADED, BERTH_PLUGIN_MODEL, "picky", ""},
    {"model_testmodel.so", PLUGIN_LOADED, BERTH_PLUGIN_MODEL, "testmodel", ""},
    {"not_elf.so", PLUGIN_REJECTED, 0, NULL, "@DLERROR@"},
};
#define N_EXPECTED (sizeof expected / sizeof expected[0])

static char *plugdir, *tmp;

static void setup(void)
{
    plugdir = ts_test_plugin_dir();
    tmp = ts_tmpdir();
}

static void teardown(void)
{
    ts_rmtree(tmp);
    free(tmp);
    free(plugdir);
}

static struct berth_config *load_config(const char *path)
{
    struct berth_config *cfg = NULL;
    ck_assert_msg(config_load(path, &cfg) == BERTH_OK, "%s", berth_last_error());
    return cfg;
}

static struct registry *load_registry(const struct berth_config *cfg)
{
    struct registry *reg = NULL;
    ck_assert_msg(registry_load(cfg, &reg) == BERTH_OK, "%s", berth_last_error());
    return reg;
}

static char *expected_reason(const struct expect *e)
{
    if (strcmp(e->reason, "@DLERROR@") == 0) {
        char *path = ts_fmt("%s/%s", plugdir, e->file);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        ck_assert_ptr_null(h);
        char *r = strdup(dlerror());
        free(path);
        return r;
    }
    const char *at = strstr(e->reason, "@DIR@");
    if (!at)
        return strdup(e->reason);
    return ts_fmt("%.*s%s%s", (int)(at - e->reason), e->reason, plugdir, at + 5);
}

START_TEST(every_test_plugin_gets_its_exact_status)
{
    char *ini = ts_conformance_ini();
    struct berth_config *cfg = load_config(ini);
    ts_capture_begin();
    struct registry *reg = load_registry(cfg);
    char *err = ts_capture_end();

    /* The folder's files in name order; backend_testcpu.so, also named by path=, only once; then the missing
     * path=. */
    ck_assert_int_eq(reg->n_plugins, (int)N_EXPECTED + 1);
    ck_assert_int_eq(reg->dir_n_files[0], (int)N_EXPECTED);
    for (size_t i = 0; i < N_EXPECTED; i++) {
        const struct expect *e = &expected[i];
        const struct plugin *p = &reg->plugins[i];
        char *path = ts_fmt("%s/%s", plugdir, e->file);
        char *reason = expected_reason(e);
        ck_assert_str_eq(p->path, path);
        ck_assert_msg(p->state == e->state, "%s: state %d, want %d (%s)", e->file, p->state, e->state, p->reason);
        ck_assert_str_eq(p->reason, reason);
        ck_assert_ptr_null(strchr(p->reason, '\n'));
        ck_assert_msg(p->kind == e->kind, "%s: kind %d", e->file, p->kind);
        if (e->name) {
            ck_assert_ptr_nonnull(p->desc);
            ck_assert_str_eq(p->desc->name, e->name);
        } else {
            ck_assert_ptr_null(p->desc);
        }
        ck_assert_int_eq(p->line, 5);
        free(reason);
        free(path);
    }
    const struct plugin *absent = &reg->plugins[N_EXPECTED];
    char *path = ts_fmt("%s/backend_absent.so", plugdir);
    char *reason = ts_fmt("%s:9: [plugins] path: No such file or directory", ini);
    ck_assert_str_eq(absent->path, path);
    ck_assert_int_eq(absent->state, PLUGIN_MISSING);
    ck_assert_str_eq(absent->reason, reason);
    ck_assert_int_eq(absent->line, 9);

    /* A missing path= is a warning, logged and kept. */
    char *warning = ts_fmt("%s:9: [plugins] path '%s': No such file or directory (skipped)", ini, path);
    ck_assert_int_eq(reg->n_warnings, 1);
    ck_assert_str_eq(reg->warnings[0], warning);
    char *log = ts_fmt("berth: warning: %s\n", warning);
    ck_assert_str_eq(err, log);
    /* Loading leaves no stale error behind. */
    ck_assert_str_eq(berth_last_error(), "");

    free(log);
    free(warning);
    free(reason);
    free(path);
    free(err);
    registry_free(reg);
    config_free(cfg);
    free(ini);
}
END_TEST

START_TEST(loaded_plugins_are_probed_and_wired)
{
    char *ini = ts_conformance_ini();
    struct berth_config *cfg = load_config(ini);
    struct registry *reg = load_registry(cfg);

    struct plugin *cpu = registry_find(reg, BERTH_PLUGIN_BACKEND, "testcpu");
    ck_assert_ptr_nonnull(cpu);
    ck_assert_ptr_eq(cpu, &reg->plugins[15]); /* the first of the two "testcpu"s */
    ck_assert_int_eq(cpu->probe.n_devices, 1);
    ck_assert_str_eq(cpu->probe.message, "1 test device");
    ck_assert_ptr_nonnull(cpu->devices);
    ck_assert_str_eq(cpu->devices[0].name, "Test CPU device 0");
    ck_assert_uint_eq(cpu->devices[0].total_memory, 1ull << 30);
    ck_assert_uint_eq(cpu->devices[0].caps, BERTH_CAP_WRAP_HOST | BERTH_CAP_HOST_VISIBLE);
    ck_assert_int_eq(cpu->abi_known, 1);
    ck_assert_uint_eq(cpu->abi_major, BERTH_ABI_MAJOR);
    ck_assert_uint_eq(cpu->abi_minor, BERTH_ABI_MINOR);
    /* Its host table points at its own context and its own config section. */
    ck_assert_ptr_eq(cpu->host.ctx, &cpu->host_ctx);
    ck_assert_str_eq(cpu->host_ctx.plugin_name, "testcpu");
    ck_assert_ptr_eq(cpu->host_ctx.section, config_section(cfg, "backend.testcpu"));
    ck_assert_ptr_nonnull(cpu->cfg);
    ck_assert_int_eq(plugin_priority(cpu), 10);
    ck_assert_int_eq(plugin_enabled(cpu), 1);
    ck_assert_int_eq(plugin_device(cpu), 0);

    struct plugin *newminor = registry_find(reg, BERTH_PLUGIN_BACKEND, "newminor");
    ck_assert_ptr_nonnull(newminor);
    ck_assert_int_eq(plugin_enabled(newminor), 0);
    ck_assert_int_eq(plugin_priority(newminor), 200);
    ck_assert_uint_eq(newminor->abi_minor, 9);

    struct plugin *zero = registry_find(reg, BERTH_PLUGIN_BACKEND, "zerodev");
    ck_assert_ptr_nonnull(zero);
    ck_assert_int_eq(zero->probe.n_devices, 0);
    ck_assert_ptr_null(zero->devices);

    struct plugin *model = registry_find(reg, BERTH_PLUGIN_MODEL, "testmodel");
    ck_assert_ptr_nonnull(model);
    ck_assert_ptr_eq(model->host_ctx.section, config_section(cfg, "model.testmodel"));
    ck_assert_str_eq(model->host.config_get(model->host.ctx, "head_dim"), "64");
    ck_assert_ptr_null(model->cfg);

    /* Rejected plugins are never found by name, and kinds do not mix. */
    ck_assert_ptr_null(registry_find(reg, BERTH_PLUGIN_BACKEND, "nullmember"));
    ck_assert_ptr_null(registry_find(reg, BERTH_PLUGIN_MODEL, "testcpu"));
    ck_assert_ptr_null(registry_find(reg, BERTH_PLUGIN_BACKEND, "testmodel"));
    registry_free(reg);
    config_free(cfg);
    free(ini);
}
END_TEST

START_TEST(nothing_is_ever_unloaded)
{
    char *ini = ts_conformance_ini();
    struct berth_config *cfg = load_config(ini);
    struct registry *reg = load_registry(cfg);
    registry_free(reg);
    config_free(cfg);
    /* Loaded and rejected-after-dlopen plugins both stay mapped after registry_free. */
    static const char *const files[] = {"backend_testcpu.so", "model_testmodel.so", "backend_badmagic.so"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *path = ts_fmt("%s/%s", plugdir, files[i]);
        void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        ck_assert_msg(h != NULL, "%s was unloaded", files[i]);
        free(path);
    }
    free(ini);
}
END_TEST

START_TEST(missing_folder_is_a_warning)
{
    char *cfgtext = ts_fmt("[plugins]\ndir = %s/nowhere\npath = %s/backend_testcpu.so\n", tmp, plugdir);
    char *ini = ts_write(tmp, "berth.ini", cfgtext);
    struct berth_config *cfg = load_config(ini);
    ts_capture_begin();
    struct registry *reg = load_registry(cfg);
    char *err = ts_capture_end();
    char *warning = ts_fmt("%s:2: [plugins] dir '%s/nowhere': No such file or directory (skipped)", ini, tmp);
    char *log = ts_fmt("berth: warning: %s\n", warning);
    ck_assert_int_eq(reg->n_warnings, 1);
    ck_assert_str_eq(reg->warnings[0], warning);
    ck_assert_str_eq(err, log);
    ck_assert_int_eq(reg->dir_n_files[0], -1);
    ck_assert_int_eq(reg->n_plugins, 1);
    ck_assert_int_eq(reg->plugins[0].state, PLUGIN_LOADED);
    ck_assert_int_eq(reg->plugins[0].line, 3);
    free(log);
    free(warning);
    free(err);
    registry_free(reg);
    config_free(cfg);
    free(ini);
    free(cfgtext);
}
END_TEST

START_TEST(default_folder_without_plugins_section)
{
    if (access(BERTH_DEFAULT_PLUGIN_DIR, F_OK) == 0)
        return; /* installed on this machine: nothing to warn about */
    char *ini = ts_write(tmp, "berth.ini", "[kv]\nblock_size = 16\n");
    struct berth_config *cfg = load_config(ini);
    ts_capture_begin();
    struct registry *reg = load_registry(cfg);
    free(ts_capture_end());
    char *warning = ts_fmt("%s: no [plugins] section and the default plugin folder '%s' is unusable: No such file or "
                           "directory",
                           ini, BERTH_DEFAULT_PLUGIN_DIR);
    ck_assert_int_eq(reg->n_warnings, 1);
    ck_assert_str_eq(reg->warnings[0], warning);
    ck_assert_int_eq(reg->n_plugins, 0);
    free(warning);
    registry_free(reg);
    config_free(cfg);
    free(ini);
}
END_TEST

START_TEST(scan_takes_only_regular_so_files_and_dedups)
{
    /* tmp/p holds: a folder named x.so, a text file, and a link to the real testcpu plugin. */
    char *p = ts_fmt("%s/p", tmp), *sub = ts_fmt("%s/p/x.so", tmp), *link = ts_fmt("%s/p/cpu_link.so", tmp);
    char *target = ts_fmt("%s/backend_testcpu.so", plugdir);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    ck_assert_int_eq(mkdir(sub, 0700), 0);
    free(ts_write(p, "readme.txt", "not a plugin\n"));
    ck_assert_int_eq(symlink(target, link), 0);
    /* The same file through the link and through an explicit path: loaded once, under the first name. */
    char *cfgtext = ts_fmt("[plugins]\ndir = %s\npath = %s\n", p, target);
    char *ini = ts_write(tmp, "berth.ini", cfgtext);
    struct berth_config *cfg = load_config(ini);
    struct registry *reg = load_registry(cfg);
    ck_assert_int_eq(reg->dir_n_files[0], 1);
    ck_assert_int_eq(reg->n_plugins, 1);
    ck_assert_str_eq(reg->plugins[0].path, link);
    ck_assert_int_eq(reg->plugins[0].state, PLUGIN_LOADED);
    ck_assert_int_eq(reg->n_warnings, 0);
    registry_free(reg);
    config_free(cfg);
    free(ini);
    free(cfgtext);
    free(target);
    free(link);
    free(sub);
    free(p);
}
END_TEST

START_TEST(empty_config_folder_loads_nothing)
{
    char *cfgtext = ts_fmt("[plugins]\ndir = %s\n", tmp);
    char *ini = ts_write(tmp, "berth.ini", cfgtext);
    struct berth_config *cfg = load_config(ini);
    struct registry *reg = load_registry(cfg);
    ck_assert_int_eq(reg->n_plugins, 0);
    ck_assert_int_eq(reg->dir_n_files[0], 0);
    ck_assert_ptr_null(registry_find(reg, BERTH_PLUGIN_BACKEND, "testcpu"));
    registry_free(reg);
    config_free(cfg);
    free(ini);
    free(cfgtext);
}
END_TEST

static Suite *conformance_suite(void)
{
    Suite *s = suite_create("plugin_conformance");
    TCase *tc = tcase_create("loader");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, every_test_plugin_gets_its_exact_status);
    tcase_add_test(tc, loaded_plugins_are_probed_and_wired);
    tcase_add_test(tc, nothing_is_ever_unloaded);
    tcase_add_test(tc, missing_folder_is_a_warning);
    tcase_add_test(tc, default_folder_without_plugins_section);
    tcase_add_test(tc, scan_takes_only_regular_so_files_and_dedups);
    tcase_add_test(tc, empty_config_folder_loads_nothing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(conformance_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

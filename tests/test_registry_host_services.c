/*
 * test_registry_host_services.c — host/host_services.c: the berth_host table every plugin gets (every member
 * filled), the log format and level filter, set_error landing in the host's last error (one line: control
 * characters escaped), and config_get/config_at
 * reading the plugin's own section.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "host_services.h"
#include "test_registry_support.h"
#include "check_run.h"

typedef void (*any_fn)(void);

START_TEST(table_is_complete)
{
    berth_host host;
    berth_host_ctx ctx;
    memset(&host, 0xab, sizeof host);
    host_services_init(&host, &ctx, "cuda", NULL);
    ck_assert_uint_eq(host.struct_size, sizeof(berth_host));
    ck_assert_uint_eq(host.abi_major, BERTH_ABI_MAJOR);
    ck_assert_uint_eq(host.abi_minor, BERTH_ABI_MINOR);
    ck_assert_str_eq(host.host_version, BERTH_VERSION);
    ck_assert_ptr_eq(host.ctx, &ctx);
    ck_assert_uint_eq(host.services, BERTH_SVC_KNOWN_MASK);
    ck_assert_str_eq(ctx.plugin_name, "cuda");
    ck_assert_ptr_null(ctx.section);
    /* Every function member from log to the last one is set. */
    size_t first = offsetof(berth_host, log), end = BERTH_SIZE_TO(berth_host, tensor_load);
    for (size_t off = first; off < end; off += sizeof(any_fn)) {
        any_fn f;
        memcpy(&f, (const char *)&host + off, sizeof f);
        ck_assert_msg(f != NULL, "berth_host member at offset %zu is NULL", off);
    }
    /* The checkpoint services are checkpoint.c's own functions. */
    ck_assert_ptr_eq((void *)host.ckpt_cfg_int, (void *)ckpt_svc_cfg_int);
    ck_assert_ptr_eq((void *)host.ckpt_tensor_find, (void *)ckpt_svc_tensor_find);
    ck_assert_ptr_eq((void *)host.tensor_load, (void *)ckpt_svc_tensor_load);
}
END_TEST

START_TEST(long_names_are_cut_safely)
{
    berth_host host;
    berth_host_ctx ctx;
    char name[200];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    host_services_init(&host, &ctx, name, NULL);
    ck_assert_uint_eq(strlen(ctx.plugin_name), sizeof ctx.plugin_name - 1);
}
END_TEST

START_TEST(log_format_and_levels)
{
    berth_host host;
    berth_host_ctx ctx;
    host_services_init(&host, &ctx, "cpu", NULL);
    ts_capture_begin();
    host.log(host.ctx, BERTH_LOG_ERROR, "device exploded");
    host.log(host.ctx, BERTH_LOG_WARN, "slow path\n");          /* trailing newline dropped */
    host.log(host.ctx, BERTH_LOG_INFO, "hidden at the default level");
    host.log(host.ctx, BERTH_LOG_DEBUG, "hidden too");
    host.log(host.ctx, BERTH_LOG_WARN, "two\nlines");            /* kept on one line */
    host.log(host.ctx, BERTH_LOG_WARN, NULL);
    host_log(BERTH_LOG_WARN, "host %s", "warning");
    host_log(BERTH_LOG_ERROR, "host error %d", 7);
    host_log(BERTH_LOG_INFO, "hidden host info");
    host_log_set_level(BERTH_LOG_INFO); /* -v */
    host.log(host.ctx, BERTH_LOG_INFO, "now shown");
    host.log(host.ctx, BERTH_LOG_DEBUG, "still hidden");
    host_log(BERTH_LOG_INFO, "host info");
    host_log_set_level(BERTH_LOG_DEBUG); /* -vv */
    host.log(host.ctx, BERTH_LOG_DEBUG, "debug shown");
    host_log(BERTH_LOG_DEBUG, "host debug");
    host_log_set_level(99); /* clamped */
    host_log(BERTH_LOG_DEBUG, "clamped");
    host_log_set_level(BERTH_LOG_WARN);
    host.log(NULL, BERTH_LOG_WARN, "no context");
    char *err = ts_capture_end();
    ck_assert_str_eq(err, "berth: [cpu] device exploded\n"
                          "berth: [cpu] slow path\n"
                          "berth: [cpu] two lines\n"
                          "berth: [cpu] (null)\n"
                          "berth: warning: host warning\n"
                          "berth: error: host error 7\n"
                          "berth: [cpu] now shown\n"
                          "berth: host info\n"
                          "berth: [cpu] debug shown\n"
                          "berth: debug: host debug\n"
                          "berth: debug: clamped\n"
                          "berth: [?] no context\n");
    free(err);
}
END_TEST

struct log_thread {
    berth_host *host;
    int id;
};

static void *log_many(void *arg)
{
    struct log_thread *t = arg;
    char msg[64];
    for (int i = 0; i < 200; i++) {
        snprintf(msg, sizeof msg, "thread %d line %d", t->id, i);
        t->host->log(t->host->ctx, BERTH_LOG_WARN, msg);
    }
    return NULL;
}

START_TEST(log_lines_from_threads_never_interleave)
{
    berth_host host;
    berth_host_ctx ctx;
    host_services_init(&host, &ctx, "cuda", NULL);
    pthread_t th[4];
    struct log_thread args[4];
    ts_capture_begin();
    for (int i = 0; i < 4; i++) {
        args[i] = (struct log_thread){&host, i};
        ck_assert_int_eq(pthread_create(&th[i], NULL, log_many, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    char *err = ts_capture_end();
    int seen[4] = {0};
    int n = 0;
    for (char *line = strtok(err, "\n"); line; line = strtok(NULL, "\n"), n++) {
        int id, i;
        char tail;
        ck_assert_msg(sscanf(line, "berth: [cuda] thread %d line %d%c", &id, &i, &tail) == 2, "mangled: %s", line);
        ck_assert_int_eq(i, seen[id]++); /* each thread's lines arrive whole and in order */
    }
    ck_assert_int_eq(n, 800);
    free(err);
}
END_TEST

START_TEST(set_error_is_the_hosts_last_error)
{
    berth_host host;
    berth_host_ctx ctx;
    host_services_init(&host, &ctx, "cpu", NULL);
    berth_clear_error();
    host.set_error(host.ctx, BERTH_E_DEVICE_OOM, "cpu: cannot allocate 12 GiB");
    ck_assert_str_eq(berth_last_error(), "cpu: cannot allocate 12 GiB");
    host.set_error(host.ctx, BERTH_E_INVALID, "100% sure %s"); /* not a format string */
    ck_assert_str_eq(berth_last_error(), "100% sure %s");
    host.set_error(host.ctx, BERTH_E_INVALID, NULL);
    ck_assert_str_eq(berth_last_error(), "(no message)");
    /* A message quoting untrusted text stays one line: control characters become C escapes (the Gemma 4
     * plugin quotes config.json values; fuzz_gemma4_config found a layer type with a newline in it). */
    host.set_error(host.ctx, BERTH_E_INVALID,
                   "config.json: layer_types.14 = 'full_att\ntion' is not a layer type\r\t\x01\x7f end");
    ck_assert_str_eq(berth_last_error(),
                     "config.json: layer_types.14 = 'full_att\\ntion' is not a layer type\\r\\t\\x01\\x7f end");
    ck_assert_int_eq(berth_fail(BERTH_E_IO, "%s: %s", "a\nb", "\x1b[31m"), BERTH_E_IO);
    ck_assert_str_eq(berth_last_error(), "a\\nb: \\x1b[31m");
}
END_TEST

START_TEST(config_services_read_the_plugins_own_section)
{
    char *tmp = ts_tmpdir();
    char *ini = ts_write(tmp, "berth.ini",
                         "[backend.cuda]\nenabled = true\ncompute = bf16\ngraphs = on\n[backend.cpu]\nthreads = 4\n");
    struct berth_config *cfg = NULL;
    ck_assert_msg(config_load(ini, &cfg) == BERTH_OK, "%s", berth_last_error());
    berth_host host;
    berth_host_ctx ctx;
    host_services_init(&host, &ctx, "cuda", config_section(cfg, "backend.cuda"));
    ck_assert_str_eq(host.config_get(host.ctx, "compute"), "bf16");
    ck_assert_ptr_null(host.config_get(host.ctx, "threads")); /* another plugin's key */
    ck_assert_ptr_null(host.config_get(host.ctx, NULL));
    const char *k = NULL, *v = NULL;
    static const char *const keys[] = {"enabled", "compute", "graphs"}, *const vals[] = {"true", "bf16", "on"};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(host.config_at(host.ctx, i, &k, &v), BERTH_OK);
        ck_assert_str_eq(k, keys[i]);
        ck_assert_str_eq(v, vals[i]);
    }
    ck_assert_int_eq(host.config_at(host.ctx, 3, &k, &v), BERTH_E_NOT_FOUND);
    ck_assert_int_eq(host.config_at(host.ctx, -1, &k, &v), BERTH_E_NOT_FOUND);

    /* No section: nothing to find, no crash. */
    host_services_init(&host, &ctx, "other", NULL);
    ck_assert_ptr_null(host.config_get(host.ctx, "compute"));
    ck_assert_int_eq(host.config_at(host.ctx, 0, &k, &v), BERTH_E_NOT_FOUND);
    config_free(cfg);
    free(ini);
    ts_rmtree(tmp);
    free(tmp);
}
END_TEST

static Suite *services_suite(void)
{
    Suite *s = suite_create("host_services");
    TCase *tc = tcase_create("services");
    tcase_add_test(tc, table_is_complete);
    tcase_add_test(tc, long_names_are_cut_safely);
    tcase_add_test(tc, log_format_and_levels);
    tcase_add_test(tc, log_lines_from_threads_never_interleave);
    tcase_add_test(tc, set_error_is_the_hosts_last_error);
    tcase_add_test(tc, config_services_read_the_plugins_own_section);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(services_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

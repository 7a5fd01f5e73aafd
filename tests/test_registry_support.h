/*
 * test_registry_support.h — helpers shared by the config, registry, selection and CLI tests: temporary folders
 * and files, capturing stderr, a tiny checkpoint, and running the berth executable.
 */
#ifndef BERTH_TEST_REGISTRY_SUPPORT_H
#define BERTH_TEST_REGISTRY_SUPPORT_H

#include <stddef.h>

/* $BERTH_BUILD_ROOT / $BERTH_SOURCE_ROOT (set by tests/meson.build); aborts the test when unset. */
const char *ts_build_root(void);
const char *ts_source_root(void);
/* "<build>/tests/plugins" and "<build>/tests/conformance.ini". Caller frees. */
char *ts_test_plugin_dir(void);
char *ts_conformance_ini(void);

/* A fresh folder under $TMPDIR (or /tmp). Caller frees; ts_rmtree removes it. */
char *ts_tmpdir(void);
void ts_rmtree(const char *dir);
/* Write text to dir/name; returns the path (caller frees). */
char *ts_write(const char *dir, const char *name, const char *text);
/* The same for n bytes that may hold NULs. Caller frees the path. */
char *ts_write_bytes(const char *dir, const char *name, const void *data, size_t n);
/* Whole file as a string, or NULL. Caller frees. */
char *ts_read(const char *path);
/* printf into a new string. Caller frees. */
char *ts_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Redirect stderr into a temporary file until ts_capture_end, which returns what was written (caller frees). */
void ts_capture_begin(void);
char *ts_capture_end(void);

/* A checkpoint folder dir with config.json {"model_type": model_type} and a one-tensor model.safetensors. */
void ts_make_checkpoint(const char *dir, const char *model_type);

/* Run argv (argv[0] a path) with extra "NAME=value" environment entries (NULL-terminated, may be NULL); collect
 * stdout and stderr (caller frees both). Returns the exit status, or -1 if it did not exit normally. */
int ts_run(char *const argv[], const char *const env_extra[], char **out, char **err);

#endif

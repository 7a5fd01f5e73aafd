/* test_registry_support.c — see test_registry_support.h. */
#include "test_registry_support.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *env_or_abort(const char *name)
{
    const char *v = getenv(name);
    if (!v || !v[0])
        ck_abort_msg("%s is not set (run through meson test)", name);
    return v;
}

const char *ts_build_root(void) { return env_or_abort("BERTH_BUILD_ROOT"); }
const char *ts_source_root(void) { return env_or_abort("BERTH_SOURCE_ROOT"); }
char *ts_test_plugin_dir(void) { return ts_fmt("%s/tests/plugins", ts_build_root()); }
char *ts_conformance_ini(void) { return ts_fmt("%s/tests/conformance.ini", ts_build_root()); }

char *ts_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    ck_assert_int_ge(n, 0);
    return s;
}

char *ts_tmpdir(void)
{
    const char *t = getenv("TMPDIR");
    char *d = ts_fmt("%s/berth-test.XXXXXX", t && t[0] ? t : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(d));
    return d;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void ts_rmtree(const char *dir)
{
    if (dir)
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

char *ts_write(const char *dir, const char *name, const char *text)
{
    char *p = ts_fmt("%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_msg(f != NULL, "cannot write %s: %s", p, strerror(errno));
    fputs(text, f);
    fclose(f);
    return p;
}

char *ts_write_bytes(const char *dir, const char *name, const void *data, size_t n)
{
    char *p = ts_fmt("%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_msg(f != NULL, "cannot write %s: %s", p, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
    return p;
}

char *ts_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    for (size_t r; s && (r = fread(s + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            s = realloc(s, cap);
        }
    }
    fclose(f);
    if (s)
        s[n] = '\0';
    return s;
}

static int saved_stderr = -1;
static char capture_path[256];

void ts_capture_begin(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(capture_path, sizeof capture_path, "%s/berth-stderr.XXXXXX", t && t[0] ? t : "/tmp");
    int fd = mkstemp(capture_path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    saved_stderr = dup(2);
    dup2(fd, 2);
    close(fd);
}

char *ts_capture_end(void)
{
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    saved_stderr = -1;
    char *s = ts_read(capture_path);
    unlink(capture_path);
    ck_assert_ptr_nonnull(s);
    return s;
}

void ts_make_checkpoint(const char *dir, const char *model_type)
{
    char *cj = ts_fmt("{\"model_type\": \"%s\", \"hidden_size\": 8}\n", model_type);
    free(ts_write(dir, "config.json", cj));
    free(cj);
    /* safetensors: 8-byte little-endian header length, JSON header, then the data (two f32). */
    const char header[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint64_t hl = sizeof header - 1;
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)(hl >> (8 * i));
    const float data[2] = {1.0f, 2.0f};
    char *p = ts_fmt("%s/model.safetensors", dir);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(len, 1, 8, f);
    fwrite(header, 1, hl, f);
    fwrite(data, sizeof data[0], 2, f);
    fclose(f);
    free(p);
}

int ts_run(char *const argv[], const char *const env_extra[], char **out, char **err)
{
    char *dir = ts_tmpdir();
    char *po = ts_fmt("%s/stdout", dir), *pe = ts_fmt("%s/stderr", dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0600), fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        for (const char *const *e = env_extra; e && *e; e++)
            putenv((char *)*e);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *out = ts_read(po);
    *err = ts_read(pe);
    ck_assert_ptr_nonnull(*out);
    ck_assert_ptr_nonnull(*err);
    ts_rmtree(dir);
    free(po);
    free(pe);
    free(dir);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

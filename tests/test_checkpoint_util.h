/*
 * test_checkpoint_util.h — helpers shared by the checkpoint/safetensors tests: a scratch directory, files
 * written byte by byte (safetensors with an arbitrary length field), a mock backend recording what tensor_load
 * does, and half-float decoders. Header-only, static functions: each test binary includes it once.
 */
#ifndef BERTH_TEST_CHECKPOINT_UTIL_H
#define BERTH_TEST_CHECKPOINT_UTIL_H

#include "checkpoint.h"
#include "errors.h"

#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TU_FN static __attribute__((unused)) /* not every test uses every helper */

/* A fresh directory under TMPDIR (or /tmp); caller removes it with tu_rmdir and frees the string. */
static char *tu_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    char buf[512];
    snprintf(buf, sizeof buf, "%s/berth-ckpt-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(buf);
    ck_assert_msg(d != NULL, "mkdtemp failed");
    return strdup(d);
}

/* Remove dir and the plain files in it, then free the string. */
TU_FN void tu_rmdir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

TU_FN void tu_write(const char *dir, const char *name, const void *data, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", p);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

TU_FN void tu_write_text(const char *dir, const char *name, const char *text)
{
    tu_write(dir, name, text, strlen(text));
}

/* A safetensors file whose length field says len_field (not necessarily strlen(header)). */
TU_FN void tu_write_st_len(const char *dir, const char *name, uint64_t len_field, const char *header,
                            const void *data, size_t data_len)
{
    size_t hl = strlen(header);
    unsigned char *b = malloc(8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(len_field >> (8 * i));
    memcpy(b + 8, header, hl);
    if (data_len)
        memcpy(b + 8 + hl, data, data_len);
    tu_write(dir, name, b, 8 + hl + data_len);
    free(b);
}

TU_FN void tu_write_st(const char *dir, const char *name, const char *header, const void *data, size_t data_len)
{
    tu_write_st_len(dir, name, strlen(header), header, data, data_len);
}

/* Path of a file in dir (static buffer, one at a time). */
TU_FN const char *tu_path(const char *dir, const char *name)
{
    static char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* Open dir expecting failure with code and exactly the message fmt (which may use %s for dir first). */
#define TU_EXPECT_OPEN_FAIL(dir, code, ...)                                                                      \
    do {                                                                                                         \
        berth_checkpoint *ck_ = (berth_checkpoint *)0x1;                                                         \
        char want_[4096];                                                                                        \
        snprintf(want_, sizeof want_, __VA_ARGS__);                                                              \
        berth_clear_error();                                                                                     \
        berth_status st_ = ckpt_open((dir), &ck_);                                                               \
        ck_assert_str_eq(berth_last_error(), want_);                                                             \
        ck_assert_int_eq(st_, (code));                                                                           \
        ck_assert_ptr_eq(ck_, (berth_checkpoint *)0x1); /* untouched on failure */                               \
    } while (0)

/* IEEE half and bfloat16 bit patterns to float (exact). */
TU_FN float tu_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TU_FN float tu_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? INFINITY : ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* ---- mock backend ---------------------------------------------------------------------------------------- */

struct berth_buffer {
    unsigned char *mem; /* wrapped memory or a malloc'd copy */
    uint64_t n;
    int wrapped, read_only;
};
struct berth_stream {
    int syncs;
};

static struct {
    int wraps, allocs, uploads, frees, streams, stream_destroys, syncs;
    int fail_wrap, fail_alloc;
} tu_mock;

TU_FN berth_status tu_stream_create(berth_backend *be, berth_stream **out)
{
    tu_mock.streams++;
    *out = calloc(1, sizeof **out);
    return BERTH_OK;
}
TU_FN void tu_stream_destroy(berth_backend *be, berth_stream *s)
{
    tu_mock.stream_destroys++;
    free(s);
}
TU_FN berth_status tu_stream_sync(berth_backend *be, berth_stream *s)
{
    tu_mock.syncs++;
    s->syncs++;
    return BERTH_OK;
}
TU_FN berth_status tu_buffer_alloc(berth_backend *be, uint64_t n, int32_t usage, berth_buffer **out)
{
    if (tu_mock.fail_alloc)
        return berth_fail(BERTH_E_DEVICE_OOM, "mock: out of device memory");
    ck_assert_int_eq(usage, BERTH_USAGE_WEIGHTS);
    tu_mock.allocs++;
    berth_buffer *b = calloc(1, sizeof *b);
    b->mem = malloc(n);
    b->n = n;
    *out = b;
    return BERTH_OK;
}
TU_FN void tu_buffer_free(berth_backend *be, berth_buffer *b)
{
    if (!b)
        return;
    tu_mock.frees++;
    if (!b->wrapped)
        free(b->mem);
    free(b);
}
TU_FN berth_status tu_buffer_wrap(berth_backend *be, void *p, uint64_t n, int32_t ro, berth_buffer **out)
{
    if (tu_mock.fail_wrap)
        return berth_fail(BERTH_E_BACKEND, "mock: cannot register host memory");
    tu_mock.wraps++;
    berth_buffer *b = calloc(1, sizeof *b);
    b->mem = p;
    b->n = n;
    b->wrapped = 1;
    b->read_only = ro;
    *out = b;
    return BERTH_OK;
}
TU_FN berth_status tu_buffer_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t off,
                                     const void *src, uint64_t n)
{
    ck_assert_uint_le(off + n, dst->n);
    tu_mock.uploads++;
    memcpy(dst->mem + off, src, n);
    return BERTH_OK;
}

static const berth_backend_vtable tu_vt = {
    .struct_size = sizeof(berth_backend_vtable),
    .stream_create = tu_stream_create,
    .stream_destroy = tu_stream_destroy,
    .stream_sync = tu_stream_sync,
    .buffer_alloc = tu_buffer_alloc,
    .buffer_free = tu_buffer_free,
    .buffer_wrap_host = tu_buffer_wrap,
    .buffer_upload = tu_buffer_upload,
};

/* A backend_api for the mock; wrap selects BERTH_CAP_WRAP_HOST. be_id distinguishes backend instances. */
TU_FN void tu_mock_api(berth_backend_api *api, berth_device_info *dev, int wrap, uintptr_t be_id)
{
    memset(dev, 0, sizeof *dev);
    dev->struct_size = sizeof *dev;
    dev->caps = wrap ? BERTH_CAP_WRAP_HOST : 0;
    memset(api, 0, sizeof *api);
    api->struct_size = sizeof *api;
    api->vt = &tu_vt;
    api->be = (berth_backend *)be_id;
    api->device = dev;
}

#endif

/* safetensors.c — map a safetensors file and validate its header (see safetensors.h). */
#include "safetensors.h"

#include "errors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef unsigned long long ull;

/* Every byte-sized dtype of the safetensors format; berth_dtype -1 where berth has none. */
static const struct {
    const char *name;
    uint32_t size;
    berth_dtype dtype;
} st_dtypes[] = {
    {"F32", 4, BERTH_DTYPE_F32}, {"F16", 2, BERTH_DTYPE_F16}, {"BF16", 2, BERTH_DTYPE_BF16},
    {"I32", 4, BERTH_DTYPE_I32}, {"I64", 8, BERTH_DTYPE_I64}, {"U8", 1, BERTH_DTYPE_U8},
    {"BOOL", 1, -1},             {"I8", 1, -1},               {"I16", 2, -1},
    {"U16", 2, -1},              {"U32", 4, -1},              {"U64", 8, -1},
    {"F64", 8, -1},              {"F8_E4M3", 1, -1},          {"F8_E5M2", 1, -1},
    {"F8_E8M0", 1, -1},
};

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

static int cmp_by_begin(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a, *y = *(const struct st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* "[2, 3]" into buf, for messages. */
static const char *shape_str(const struct st_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int32_t i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

/* s with control characters as '?' and cut to fit buf, so a message stays one line. */
static const char *printable(const char *s, char *buf, size_t cap)
{
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        buf[i] = ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) ? '?' : s[i];
    buf[i] = '\0';
    return buf;
}

static int get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

/* Validate one header member and fill *t (name already set). data_size bounds the byte range. */
static berth_status parse_entry(const char *path, const json_t *e, uint64_t data_size, struct st_tensor *t)
{
    const char *name = t->name;
    if (!json_is_object(e))
        return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': header entry is not an object", path, name);

    const json_t *dt = json_object_get(e, "dtype");
    if (!json_is_string(dt))
        return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': dtype is missing or not a string", path, name);
    const char *dn = json_string_value(dt);
    t->dtype_name = NULL;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(dn, st_dtypes[i].name) == 0) {
            t->dtype_name = st_dtypes[i].name;
            t->elem_size = st_dtypes[i].size;
            t->dtype = st_dtypes[i].dtype;
            break;
        }
    }
    if (!t->dtype_name) {
        char pbuf[64];
        return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': unknown dtype \"%s\"", path, name,
                          printable(dn, pbuf, sizeof pbuf));
    }

    const json_t *sh = json_object_get(e, "shape");
    if (!json_is_array(sh))
        return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': shape is missing or not an array", path, name);
    size_t rank = json_array_size(sh);
    if (rank > ST_MAX_DIMS)
        return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': shape has %zu dimensions, at most %d are supported",
                          path, name, rank, ST_MAX_DIMS);
    /* span multiplies the dimensions with 0 counted as 1: it bounds every stride a consumer computes, so it must
     * fit in int64 even for a zero-size tensor. nbytes is the real size. */
    uint64_t nbytes = t->elem_size, span = t->elem_size;
    int overflow = 0;
    for (size_t i = 0; i < rank; i++) {
        uint64_t d;
        if (!get_u64(json_array_get(sh, i), &d))
            return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': shape[%zu] is not a non-negative integer", path,
                              name, i);
        t->shape[i] = (int64_t)d;
        nbytes *= d; /* exact whenever span does not overflow, since nbytes <= span or nbytes == 0 */
        overflow |= __builtin_mul_overflow(span, d ? d : 1, &span);
    }
    t->ndim = (int32_t)rank;
    if (overflow || span > (uint64_t)INT64_MAX)
        return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': shape is too large (byte size overflows)", path, name);

    const json_t *off = json_object_get(e, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 || !get_u64(json_array_get(off, 0), &t->begin) ||
        !get_u64(json_array_get(off, 1), &t->end))
        return berth_fail(BERTH_E_INVALID,
                          "%s: tensor '%s': data_offsets is missing or not two non-negative integers", path, name);
    if (t->begin > t->end)
        return berth_fail(BERTH_E_INVALID, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path,
                          name, (ull)t->begin, (ull)t->end);
    if (t->end > data_size)
        return berth_fail(BERTH_E_INVALID,
                          "%s: tensor '%s': data_offsets end %llu is past the end of the data section (%llu bytes; "
                          "truncated file?)",
                          path, name, (ull)t->end, (ull)data_size);
    if (t->end - t->begin != nbytes) {
        char sbuf[256];
        return berth_fail(BERTH_E_INVALID,
                          "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] span %llu",
                          path, name, shape_str(t, sbuf, sizeof sbuf), t->dtype_name, (ull)nbytes, (ull)t->begin,
                          (ull)t->end, (ull)(t->end - t->begin));
    }
    return BERTH_OK;
}

/* Parse the header JSON at f->map + 8 (n bytes) into f->tensors. */
static berth_status parse_header(struct st_file *f, uint64_t n)
{
    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return berth_fail(BERTH_E_INVALID, "%s: header is not valid JSON: %d:%d: %s", f->path, jerr.line,
                          jerr.column, jerr.text);
    berth_status st = BERTH_OK;
    if (!json_is_object(root)) {
        st = berth_fail(BERTH_E_INVALID, "%s: header is not a JSON object", f->path);
        goto out;
    }
    const json_t *meta = json_object_get(root, "__metadata__");
    if (meta && !json_is_object(meta)) {
        st = berth_fail(BERTH_E_INVALID, "%s: __metadata__ is not an object", f->path);
        goto out;
    }
    size_t cap = json_object_size(root) - (meta ? 1 : 0);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = berth_fail(BERTH_E_NOMEM, "%s: out of memory for %zu tensor entries", f->path, cap);
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        /* Names end up in one-line messages: refuse control characters (JSON escapes like \n allow them). */
        for (const unsigned char *c = (const unsigned char *)key; *c; c++) {
            if (*c < 0x20 || *c == 0x7f) {
                st = berth_fail(BERTH_E_INVALID, "%s: tensor name '%.*s...' contains control character 0x%02x",
                                f->path, (int)(c - (const unsigned char *)key), key, *c);
                goto out;
            }
        }
        struct st_tensor *t = &f->tensors[f->n_tensors];
        if (!(t->name = strdup(key))) {
            st = berth_fail(BERTH_E_NOMEM, "%s: out of memory", f->path);
            goto out;
        }
        f->n_tensors++;
        if ((st = parse_entry(f->path, val, f->data_size, t)) != BERTH_OK)
            goto out;
        f->tensor_bytes += t->end - t->begin;
    }

    /* Overlap check: sort the non-empty ranges by start; each must begin at or after the previous end. */
    const struct st_tensor **by_begin = malloc((f->n_tensors ? (size_t)f->n_tensors : 1) * sizeof *by_begin);
    if (!by_begin) {
        st = berth_fail(BERTH_E_NOMEM, "%s: out of memory", f->path);
        goto out;
    }
    size_t m = 0;
    for (int64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].end > f->tensors[i].begin)
            by_begin[m++] = &f->tensors[i];
    qsort(by_begin, m, sizeof *by_begin, cmp_by_begin);
    for (size_t i = 1; i < m; i++) {
        const struct st_tensor *a = by_begin[i - 1], *b = by_begin[i];
        if (b->begin < a->end) {
            st = berth_fail(BERTH_E_INVALID, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", f->path,
                            a->name, (ull)a->begin, (ull)a->end, b->name, (ull)b->begin, (ull)b->end);
            break;
        }
    }
    free(by_begin);
    if (st == BERTH_OK)
        qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_by_name);
out:
    json_decref(root);
    return st;
}

berth_status st_open(const char *path, struct st_file **out)
{
    struct st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return berth_fail(BERTH_E_NOMEM, "%s: out of memory", path);
    }
    berth_status st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        st = berth_fail(e == ENOENT ? BERTH_E_NOT_FOUND : BERTH_E_IO, "%s: cannot open: %s", path, strerror(e));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = berth_fail(BERTH_E_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = berth_fail(BERTH_E_INVALID, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        st = berth_fail(BERTH_E_INVALID, "%s: file is %llu bytes, too short for the 8-byte header length", path,
                        (ull)size);
        close(fd);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file referenced */
    if (map == MAP_FAILED) {
        st = berth_fail(map_errno == ENOMEM ? BERTH_E_NOMEM : BERTH_E_IO, "%s: mmap of %llu bytes failed: %s", path,
                        (ull)size, strerror(map_errno));
        goto fail;
    }
    f->map = map;
    f->map_size = size;

    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | f->map[i];
    if (n > ST_MAX_HEADER) {
        st = berth_fail(BERTH_E_INVALID, "%s: header length %llu exceeds the limit of %llu bytes", path, (ull)n,
                        (ull)ST_MAX_HEADER);
        goto fail;
    }
    if (n > size - 8) {
        st = berth_fail(BERTH_E_INVALID,
                        "%s: header length %llu is larger than the file (%llu bytes after the length field)", path,
                        (ull)n, (ull)(size - 8));
        goto fail;
    }
    f->data_offset = 8 + n;
    f->data_size = size - f->data_offset;
    if ((st = parse_header(f, n)) != BERTH_OK)
        goto fail;
    *out = f;
    return BERTH_OK;
fail:
    st_close(f);
    return st;
}

void st_close(struct st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap((void *)f->map, (size_t)f->map_size);
    for (int64_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    free(f);
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
    struct st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_by_name);
}

const void *st_tensor_data(const struct st_file *f, const struct st_tensor *t)
{
    return f->map + f->data_offset + t->begin;
}

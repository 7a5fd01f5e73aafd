/* json_path.c — '.'-separated path lookups in a jansson tree (see json_path.h). */
#include "json_path.h"

#include "errors.h"

#include <stdlib.h>
#include <string.h>

int32_t jpath_kind(const json_t *v)
{
    if (!v)
        return BERTH_JSON_MISSING;
    switch (json_typeof(v)) {
    case JSON_NULL: return BERTH_JSON_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return BERTH_JSON_BOOL;
    case JSON_INTEGER: return BERTH_JSON_INT;
    case JSON_REAL: return BERTH_JSON_REAL;
    case JSON_STRING: return BERTH_JSON_STRING;
    case JSON_ARRAY: return BERTH_JSON_ARRAY;
    case JSON_OBJECT: return BERTH_JSON_OBJECT;
    }
    return BERTH_JSON_MISSING;
}

const char *jpath_kind_name(const json_t *v)
{
    static const char *const names[] = {"missing", "null",   "boolean", "integer",
                                        "real",    "string", "array",   "object"};
    return names[jpath_kind(v)];
}

/* Parse a segment as a decimal array index (digits only); 0 if it is not one or does not fit. */
static int parse_index(const char *s, size_t n, size_t *out)
{
    if (n == 0 || n > 18)
        return 0;
    size_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    *out = v;
    return 1;
}

berth_status jpath_get(const json_t *root, const char *file, const char *path, const json_t **out)
{
    const json_t *node = root;
    const char *seg = path;
    if (!root)
        return berth_fail(BERTH_E_INVALID, "%s: no JSON document", file);
    if (!path)
        return berth_fail(BERTH_E_INVALID, "%s: NULL path", file);
    while (*path) {
        const char *dot = strchr(seg, '.');
        size_t n = dot ? (size_t)(dot - seg) : strlen(seg);
        /* Parent path for messages: everything before this segment, minus its trailing '.'. */
        int parent_len = seg > path ? (int)(seg - path - 1) : 0;
        if (json_is_object(node)) {
            char small[256], *key = n < sizeof small ? small : malloc(n + 1);
            if (!key)
                return berth_fail(BERTH_E_NOMEM, "%s: %s: out of memory", file, path);
            memcpy(key, seg, n);
            key[n] = '\0';
            const json_t *next = json_object_get(node, key);
            if (key != small)
                free(key);
            if (!next) {
                if (parent_len == 0)
                    return berth_fail(BERTH_E_NOT_FOUND, "%s: %s: no key \"%.*s\" at the top level", file, path,
                                      (int)n, seg);
                return berth_fail(BERTH_E_NOT_FOUND, "%s: %s: no key \"%.*s\" in %.*s", file, path, (int)n, seg,
                                  parent_len, path);
            }
            node = next;
        } else if (json_is_array(node)) {
            size_t idx;
            if (!parse_index(seg, n, &idx))
                return berth_fail(BERTH_E_NOT_FOUND, "%s: %s: \"%.*s\" is not an index into the array %.*s", file,
                                  path, (int)n, seg, parent_len, path);
            if (idx >= json_array_size(node))
                return berth_fail(BERTH_E_NOT_FOUND, "%s: %s: index %zu is out of range (%.*s has %zu elements)",
                                  file, path, idx, parent_len, path, json_array_size(node));
            node = json_array_get(node, idx);
        } else {
            if (parent_len == 0)
                return berth_fail(BERTH_E_NOT_FOUND, "%s: %s: the top level is %s, not an object or array", file, path,
                                  jpath_kind_name(node));
            return berth_fail(BERTH_E_NOT_FOUND, "%s: %s: %.*s is %s, not an object or array", file, path,
                              parent_len, path, jpath_kind_name(node));
        }
        if (!dot)
            break;
        seg = dot + 1;
    }
    *out = node;
    return BERTH_OK;
}

static berth_status mismatch(const char *file, const char *path, const char *expected, const json_t *v)
{
    return berth_fail(BERTH_E_INVALID, "%s: %s: expected %s, got %s", file, *path ? path : "(top level)", expected,
                      jpath_kind_name(v));
}

berth_status jpath_int(const json_t *root, const char *file, const char *path, int64_t *out)
{
    const json_t *v;
    berth_status st = jpath_get(root, file, path, &v);
    if (st != BERTH_OK)
        return st;
    if (!json_is_integer(v))
        return mismatch(file, path, "an integer", v);
    *out = (int64_t)json_integer_value(v);
    return BERTH_OK;
}

berth_status jpath_real(const json_t *root, const char *file, const char *path, double *out)
{
    const json_t *v;
    berth_status st = jpath_get(root, file, path, &v);
    if (st != BERTH_OK)
        return st;
    if (!json_is_number(v))
        return mismatch(file, path, "a number", v);
    *out = json_number_value(v);
    return BERTH_OK;
}

berth_status jpath_bool(const json_t *root, const char *file, const char *path, int32_t *out)
{
    const json_t *v;
    berth_status st = jpath_get(root, file, path, &v);
    if (st != BERTH_OK)
        return st;
    if (!json_is_boolean(v))
        return mismatch(file, path, "true or false", v);
    *out = json_is_true(v) ? 1 : 0;
    return BERTH_OK;
}

berth_status jpath_string(const json_t *root, const char *file, const char *path, const char **out)
{
    const json_t *v;
    berth_status st = jpath_get(root, file, path, &v);
    if (st != BERTH_OK)
        return st;
    if (!json_is_string(v))
        return mismatch(file, path, "a string", v);
    *out = json_string_value(v);
    return BERTH_OK;
}

berth_status jpath_len(const json_t *root, const char *file, const char *path, int64_t *out)
{
    const json_t *v;
    berth_status st = jpath_get(root, file, path, &v);
    if (st != BERTH_OK)
        return st;
    if (json_is_array(v))
        *out = (int64_t)json_array_size(v);
    else if (json_is_object(v))
        *out = (int64_t)json_object_size(v);
    else
        return mismatch(file, path, "an array or object", v);
    return BERTH_OK;
}

berth_status jpath_key(const json_t *root, const char *file, const char *path, int64_t idx, const char **out)
{
    const json_t *v;
    berth_status st = jpath_get(root, file, path, &v);
    if (st != BERTH_OK)
        return st;
    if (!json_is_object(v))
        return mismatch(file, path, "an object", v);
    if (idx < 0 || (uint64_t)idx >= json_object_size(v))
        return berth_fail(BERTH_E_NOT_FOUND, "%s: %s: member index %lld is out of range (the object has %zu members)",
                          file, *path ? path : "(top level)", (long long)idx, json_object_size(v));
    /* jansson (>= 2.8) iterates objects in insertion order, which is file order for a parsed document. */
    void *it = json_object_iter((json_t *)v);
    for (int64_t i = 0; i < idx; i++)
        it = json_object_iter_next((json_t *)v, it);
    *out = json_object_iter_key(it);
    return BERTH_OK;
}

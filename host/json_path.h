/*
 * json_path.h — typed lookups of '.'-separated paths in a jansson tree (the checkpoint's config.json).
 *
 * A path segment names an object member by key, or an array element by decimal index when the node is an
 * array: "text_config.layer_types.3". "" is the root. Keys that themselves contain '.' cannot be addressed.
 * Failures leave a one-line message "<file>: <path>: <what>" (errors.h): BERTH_E_NOT_FOUND when the path does
 * not exist (missing key, index out of range, or a scalar where the path goes deeper), BERTH_E_INVALID when the
 * value has the wrong type ("expected an integer, got string").
 */
#ifndef BERTH_HOST_JSON_PATH_H
#define BERTH_HOST_JSON_PATH_H

#include <berth/plugin.h>
#include <jansson.h>
#include <stdint.h>

/* The node at path, or BERTH_E_NOT_FOUND. file labels messages ("config.json"). */
berth_status jpath_get(const json_t *root, const char *file, const char *path, const json_t **out);
/* BERTH_JSON_* kind of v (BERTH_JSON_MISSING for NULL). */
int32_t jpath_kind(const json_t *v);
/* "integer", "string", ... for messages. */
const char *jpath_kind_name(const json_t *v);

/* Typed getters; the out pointers are written only on BERTH_OK. Strings live as long as root. */
berth_status jpath_int(const json_t *root, const char *file, const char *path, int64_t *out);
berth_status jpath_real(const json_t *root, const char *file, const char *path, double *out); /* ints too */
berth_status jpath_bool(const json_t *root, const char *file, const char *path, int32_t *out); /* true/false */
berth_status jpath_string(const json_t *root, const char *file, const char *path, const char **out);
/* Elements of an array or members of an object. */
berth_status jpath_len(const json_t *root, const char *file, const char *path, int64_t *out);
/* Key of the idx-th member of an object, in file order. */
berth_status jpath_key(const json_t *root, const char *file, const char *path, int64_t idx, const char **out);

#endif

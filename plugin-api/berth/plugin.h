/*
 * berth/plugin.h — the berth plugin ABI: descriptor, host services, status codes, tensors.
 *
 * This is the only family of headers a berth plugin may include (<berth/plugin.h>, <berth/backend.h>,
 * <berth/model.h>). They are C99 and depend on <stdint.h> and <stddef.h> only.
 *
 * A plugin is a shared object exporting exactly one symbol, berth_plugin_entry(), which returns a pointer to a
 * static, magic-tagged, size-prefixed descriptor. Everything else reaches the host through the function tables
 * the descriptor points to and through the host services table (struct berth_host) handed to the plugin.
 *
 * ---------------------------------------------------------------------------------------------------------------
 * VERSIONING POLICY (enforced by the host's loader)
 *
 *  - BERTH_ABI_MAJOR must match exactly. A plugin built for another major is rejected with both versions named.
 *  - Any minor is accepted. Structs that cross the boundary by pointer start with a uint32_t struct_size and only
 *    ever grow by appending fields, so:
 *      * a producer (the side that fills a table: descriptor, vtables, info out-structs) sets struct_size to
 *        what it was compiled with; the consumer reads a field only if BERTH_HAS() says it is there, and
 *        otherwise uses the default documented beside the field;
 *      * for out-structs, the CALLER sets struct_size and the callee writes only the fields that fit.
 *  - A plugin that needs a host service the host lacks lists it in berth_plugin_desc.required_services; the
 *    host rejects it at load with the name of the missing service. (A plugin may also test BERTH_HAS(host, ...)
 *    itself in init and fail with BERTH_E_ABI.)
 *  - Bump the MAJOR for: removing or reordering anything, changing a field's type or meaning, renumbering an
 *    enum value. Bump the MINOR for: appending fields, enum values, status codes, capability bits, op-table
 *    entries, host services. The op table is append-only within a major.
 *  - Small value types embedded in other structs or used in arrays (berth_tensor, berth_kv_view) carry no
 *    struct_size: they can never grow without changing their parent's layout, so they are frozen for the
 *    whole major. tests/abi_layout.c asserts every public struct's offsets and sizes with literal numbers, so
 *    an accidental change fails the build.
 *  - 1.x is frozen: within a major nothing is removed, reordered or redefined, only appended, and every layout
 *    stays as tests/abi_layout.c pins it. A plugin built for any 1.x minor loads on any 1.y host: an older minor
 *    is bridged by struct_size (what it lacks reads as the documented default), a newer one is accepted with a
 *    note (the host never reads what it does not know). An append that a caller relies on (one an older callee
 *    would silently ignore) therefore comes with something the caller checks first, e.g. a capability bit.
 *  - A plugin built for 0.x fails the major check and must be rebuilt. 0.x was unstable: a minor could break
 *    layouts (0.2 did) or append a field callers relied on (0.4 to 0.6), so its loader rejected older 0.x minors
 *    through BERTH_ABI_MINOR_MIN. 1.0 froze 0.6's layouts unchanged; docs/ABI.md, "ABI history", lists each step.
 *
 * OWNERSHIP: whoever creates an object destroys it with the matching call on the same side. Destroy/free calls
 * accept NULL. Strings and arrays a plugin returns live as long as the object they came from (or, for the
 * descriptor, as long as the process). Pointers the host passes into a call are valid only for that call unless
 * a field says otherwise.
 *
 * ERRORS: every call that can fail returns berth_status (0 = BERTH_OK, negative = error). Before returning an
 * error a plugin should call host->set_error() with a one-line message; the host copies it. Plugins never call
 * exit(), abort() or assert(), and never print to stdout/stderr: use host->log().
 *
 * THREADING: berth_plugin_entry and the descriptor are pure and thread-safe. init/destroy style calls are made
 * by one host thread at a time. A stream and everything enqueued on it is externally synchronized (one host
 * thread at a time). Host services may be called from any plugin thread, including internal worker threads,
 * and never call back into the plugin.
 *
 * UNLOADING: the host never dlclose()s a plugin while the process runs (CUDA and similar runtimes register
 * handlers that outlive dlclose).
 */
#ifndef BERTH_PLUGIN_H
#define BERTH_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BERTH_ABI_MAJOR 1
#define BERTH_ABI_MINOR 0
/* Oldest minor the host accepts within this major: 0, so any 1.x minor loads (struct_size bridges them). 0.x set it
 * to its oldest compatible minor, since an older 0.x plugin would have been misread; the loader's check is generic
 * and simply never fires at 0. */
#define BERTH_ABI_MINOR_MIN 0
#define BERTH_PLUGIN_MAGIC 0x42525448u /* "BRTH" */

/* Size of a struct up to and including `field` (ignores tail padding, which is not part of the ABI). */
#define BERTH_SIZE_TO(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
/* True if the struct behind p (which starts with uint32_t struct_size) contains `field`. */
#define BERTH_HAS(p, type, field) ((size_t)(p)->struct_size >= BERTH_SIZE_TO(type, field))

#if defined(_WIN32)
#define BERTH_EXPORT __declspec(dllexport)
#else
#define BERTH_EXPORT __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------------------------------
 * Status codes. Values are fixed forever; new codes are appended. Unknown negative values mean "failed". */
typedef int32_t berth_status;
#define BERTH_OK 0
#define BERTH_E_INVALID -1       /* bad argument or bad input data */
#define BERTH_E_NOMEM -2         /* host memory exhausted */
#define BERTH_E_DEVICE_OOM -3    /* device memory exhausted */
#define BERTH_E_UNSUPPORTED -4   /* op, parameter, dtype or checkpoint not supported by this plugin */
#define BERTH_E_ABI -5           /* version or struct-size mismatch */
#define BERTH_E_NOT_FOUND -6     /* named thing (tensor, key, device) does not exist */
#define BERTH_E_IO -7            /* file or OS error */
#define BERTH_E_BACKEND -8       /* device/runtime error */
#define BERTH_E_DEVICE_LOST -9   /* sticky device error: every later call on this backend fails */
#define BERTH_E_CANCELLED -10
#define BERTH_E_INTERNAL -11     /* a bug */
#define BERTH_E_NO_DEVICE -12    /* the hardware this backend drives is not present */

/* ---------------------------------------------------------------------------------------------------------------
 * Element types. Values fixed forever. */
typedef int32_t berth_dtype;
#define BERTH_DTYPE_F32 0
#define BERTH_DTYPE_F16 1
#define BERTH_DTYPE_BF16 2
#define BERTH_DTYPE_I32 3
#define BERTH_DTYPE_I64 4
#define BERTH_DTYPE_U8 5
#define BERTH_DTYPE_COUNT 6
#define BERTH_DTYPE_BIT(t) (1u << (t))

/* ---------------------------------------------------------------------------------------------------------------
 * Opaque handles. Buffers and streams belong to a backend; checkpoints belong to the host. */
typedef struct berth_buffer berth_buffer;         /* a backend allocation (device or host memory) */
typedef struct berth_stream berth_stream;         /* an ordered queue of backend work */
typedef struct berth_host_ctx berth_host_ctx;     /* host-side state of one loaded plugin */
typedef struct berth_checkpoint berth_checkpoint; /* a model directory opened by the host (config.json + weights) */

/* A view of memory inside a backend buffer. Frozen value type (no struct_size).
 * Dimensions follow the ggml convention: ne[0] is the innermost, contiguous dimension; nb[i] is the byte stride
 * of dimension i and nb[0] must equal the element size. Unused dimensions have ne = 1. A PyTorch tensor of shape
 * [T, H, d] is ne = {d, H, T, 1}. Ops state which arguments may have non-packed outer strides (views). */
typedef struct berth_tensor {
    berth_buffer *buf; /* NULL in capability queries (supports()), where only dtype and shape matter */
    uint64_t offset;   /* byte offset of element 0 inside buf */
    berth_dtype dtype;
    int32_t ndim; /* informational; 1..4 */
    int64_t ne[4];
    int64_t nb[4];
} berth_tensor;

/* ---------------------------------------------------------------------------------------------------------------
 * Host services: a table the host hands to every plugin call that may need it. Valid until the plugin's object
 * that received it is destroyed. */
#define BERTH_LOG_ERROR 0
#define BERTH_LOG_WARN 1
#define BERTH_LOG_INFO 2
#define BERTH_LOG_DEBUG 3

/* JSON value kinds returned by ckpt_cfg_type(). */
#define BERTH_JSON_MISSING 0
#define BERTH_JSON_NULL 1
#define BERTH_JSON_BOOL 2
#define BERTH_JSON_INT 3
#define BERTH_JSON_REAL 4
#define BERTH_JSON_STRING 5
#define BERTH_JSON_ARRAY 6
#define BERTH_JSON_OBJECT 7

/* Bits for berth_plugin_desc.required_services: the host services a plugin cannot work without. */
#define BERTH_SVC_LOG (1ull << 0)         /* log, set_error */
#define BERTH_SVC_CONFIG (1ull << 1)      /* config_get, config_at */
#define BERTH_SVC_CHECKPOINT (1ull << 2)  /* ckpt_cfg_*, ckpt_tensor_* */
#define BERTH_SVC_TENSOR_LOAD (1ull << 3) /* tensor_load */
#define BERTH_SVC_KNOWN_MASK ((1ull << 4) - 1)

/* What the host knows about one checkpoint tensor. Out-struct: caller sets struct_size. */
typedef struct berth_tensor_info {
    uint32_t struct_size;
    berth_dtype dtype;
    const char *name;     /* full name as stored in the file; valid while the checkpoint is open */
    const void *data;     /* read-only pointer into the host's mapping of the file; valid while it is open */
    uint64_t nbytes;
    int32_t ndim;         /* 0..8 (0 = scalar) */
    int32_t reserved0;
    int64_t shape[8];     /* PyTorch order (outermost first), as in the safetensors header */
    /* ABI 0.1: fields above. */
    const char *file;     /* the shard holding it, a file name inside the checkpoint directory
                           * ("model-00002-of-00005.safetensors"); valid while the checkpoint is open. Default
                           * (older host): unknown, name the directory instead (ckpt_dir). */
    /* ABI 0.2: fields above. Append below only. */
} berth_tensor_info;

struct berth_backend_api; /* defined in berth/backend.h */

typedef struct berth_host {
    uint32_t struct_size;
    uint16_t abi_major;
    uint16_t abi_minor;
    const char *host_version; /* "0.1.0"; static */
    berth_host_ctx *ctx;      /* pass back to every service call */
    uint64_t services;        /* BERTH_SVC_* bits this host provides */

    /* --- BERTH_SVC_LOG --- */
    /* Log one line (no trailing newline needed). The host copies msg and tags it with the plugin's name. */
    void (*log)(berth_host_ctx *ctx, int32_t level, const char *msg);
    /* Record the message for the error the caller is about to return. Copied; last one wins per thread. */
    void (*set_error)(berth_host_ctx *ctx, berth_status code, const char *msg);

    /* --- BERTH_SVC_CONFIG: the plugin's own INI section ([backend.NAME] or [model.NAME]) --- */
    /* Value of key, or NULL if absent. Host-owned, valid until the plugin is shut down. */
    const char *(*config_get)(berth_host_ctx *ctx, const char *key);
    /* idx-th key/value pair of the section in file order; BERTH_E_NOT_FOUND past the end. */
    berth_status (*config_at)(berth_host_ctx *ctx, int32_t idx, const char **key, const char **value);

    /* --- BERTH_SVC_CHECKPOINT: config.json and the tensor index of an opened checkpoint ---
     * JSON paths are '.'-separated; a segment addresses an object member by key, or an array element by decimal
     * index when the node is an array ("text_config.layer_types.3"). An empty path is the root. Returned strings
     * live while the checkpoint is open. A type mismatch is BERTH_E_INVALID; a missing path BERTH_E_NOT_FOUND. */
    int32_t (*ckpt_cfg_type)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path);
    berth_status (*ckpt_cfg_int)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out);
    berth_status (*ckpt_cfg_real)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path,
                                  double *out); /* accepts integers too */
    berth_status (*ckpt_cfg_bool)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int32_t *out);
    berth_status (*ckpt_cfg_string)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path,
                                    const char **out);
    /* Number of elements of an array or members of an object. */
    berth_status (*ckpt_cfg_len)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out);
    /* Key of the idx-th member of an object, in file order. */
    berth_status (*ckpt_cfg_key)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t idx,
                                 const char **out);
    /* Directory of the checkpoint (for messages). */
    const char *(*ckpt_dir)(berth_host_ctx *ctx, const berth_checkpoint *ck);
    /* Number of tensors over all shards, and the idx-th one (sorted by name). */
    int64_t (*ckpt_tensor_count)(berth_host_ctx *ctx, const berth_checkpoint *ck);
    berth_status (*ckpt_tensor_at)(berth_host_ctx *ctx, const berth_checkpoint *ck, int64_t idx,
                                   berth_tensor_info *out);
    /* Look a tensor up by its full name; BERTH_E_NOT_FOUND (with a message naming it) if absent. */
    berth_status (*ckpt_tensor_find)(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *name,
                                     berth_tensor_info *out);

    /* --- BERTH_SVC_TENSOR_LOAD --- */
    /* Make checkpoint tensor `name` available to backend `be` as out (dtype and shape as stored, packed, ne in
     * ggml order). The host wraps its mapping without a copy when the backend reports BERTH_CAP_WRAP_HOST,
     * otherwise it allocates a device buffer and uploads. The memory stays valid, read-only, until the
     * checkpoint is closed; the host owns it. */
    berth_status (*tensor_load)(berth_host_ctx *ctx, const berth_checkpoint *ck, const struct berth_backend_api *be,
                                const char *name, berth_tensor *out);
    /* ABI 0.1: fields above. Append below only. */
} berth_host;

/* ---------------------------------------------------------------------------------------------------------------
 * The descriptor. */
#define BERTH_PLUGIN_BACKEND 1
#define BERTH_PLUGIN_MODEL 2

typedef struct berth_plugin_desc {
    uint32_t magic;       /* BERTH_PLUGIN_MAGIC */
    uint32_t struct_size; /* BERTH_SIZE_TO(berth_plugin_desc, <last field compiled>) */
    uint16_t abi_major;   /* BERTH_ABI_MAJOR the plugin was compiled against */
    uint16_t abi_minor;   /* BERTH_ABI_MINOR the plugin was compiled against */
    int32_t kind;         /* BERTH_PLUGIN_BACKEND or BERTH_PLUGIN_MODEL */
    const char *name;     /* short unique name: "cpu", "cuda", "gemma4"; static */
    const char *version;  /* the plugin's own version string; static */
    const char *description; /* one line for `berth plugins`; static; may be NULL */
    uint64_t required_services; /* BERTH_SVC_* bits the plugin needs from the host */
    /* struct berth_backend_vtable* (kind BACKEND) or struct berth_model_vtable* (kind MODEL); static */
    const void *vtable;
    /* ABI 0.1: fields above. Append below only. */
} berth_plugin_desc;

/* The one exported symbol. Pure: no allocation, no device calls, callable from any thread. The host passes its
 * own ABI version so a plugin may return a descriptor matching it, or NULL if it cannot serve that major. */
typedef const berth_plugin_desc *(*berth_plugin_entry_fn)(uint32_t host_abi_major, uint32_t host_abi_minor);
#define BERTH_PLUGIN_ENTRY_SYMBOL "berth_plugin_entry"

#ifdef __cplusplus
}
#endif
#endif /* BERTH_PLUGIN_H */

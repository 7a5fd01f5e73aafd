/*
 * safetensors.h — one safetensors file, mmap'd read-only with its header validated.
 *
 * Layout: 8-byte little-endian u64 N, N bytes of JSON header, then the data section. st_open maps the whole
 * file (PROT_READ, MAP_PRIVATE) and rejects, with a one-line message naming the file and the tensor, a header
 * that lies: N above ST_MAX_HEADER or past the end of the file, non-object JSON, an unknown dtype, a shape that
 * is not an array of non-negative integers (or whose byte size overflows), data_offsets outside the data
 * section or not matching shape x dtype size, byte ranges of two tensors that overlap, duplicate names, and names
 * with control characters. "__metadata__" must be an object; its contents are ignored. Gaps between tensors are
 * allowed.
 *
 * Dtypes: every byte-sized safetensors dtype is accepted at open (its size is needed to check the byte range);
 * those berth has no berth_dtype for (BOOL, I8, I16, U16, U32, U64, F64, F8_*) get dtype -1 and the checkpoint
 * services report BERTH_E_UNSUPPORTED only when a plugin asks for such a tensor. Sub-byte and unknown dtype
 * names are rejected at open.
 *
 * Alignment: tensor data starts at map + 8 + N + begin, which the format does not align to the element size
 * (writers usually pad N to a multiple of 8, but nothing guarantees it). Pointers are handed out as they are;
 * consumers must read through memcpy-safe or unaligned-tolerant code.
 */
#ifndef BERTH_HOST_SAFETENSORS_H
#define BERTH_HOST_SAFETENSORS_H

#include <berth/plugin.h>
#include <stdint.h>

#define ST_MAX_HEADER (100ull << 20) /* 100 MiB: far above any real header, low enough to refuse garbage */
#define ST_MAX_DIMS 8                /* berth_tensor_info.shape */

struct st_tensor {
    char *name;            /* owned */
    const char *dtype_name; /* "BF16": static */
    berth_dtype dtype;     /* -1 when berth has no such dtype (see above) */
    uint32_t elem_size;
    int32_t ndim;          /* 0 = scalar */
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end;   /* byte range inside the data section */
};

struct st_file {
    char *path;             /* as given to st_open; owned */
    const uint8_t *map;     /* the whole file */
    uint64_t map_size;
    uint64_t data_offset;   /* 8 + N: where the data section starts in the file */
    uint64_t data_size;     /* map_size - data_offset */
    struct st_tensor *tensors; /* sorted by name (strcmp) */
    int64_t n_tensors;
    uint64_t tensor_bytes;  /* sum of end - begin */
};

/* Map and validate path. Caller closes with st_close. */
berth_status st_open(const char *path, struct st_file **out);
/* Unmap and free. Accepts NULL. */
void st_close(struct st_file *f);
/* Binary search by name; NULL if absent. */
const struct st_tensor *st_find(const struct st_file *f, const char *name);
/* Pointer to the tensor's first byte inside the mapping (possibly unaligned). */
const void *st_tensor_data(const struct st_file *f, const struct st_tensor *t);

#endif

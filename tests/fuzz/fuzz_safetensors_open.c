/*
 * fuzz_safetensors_open.c — libFuzzer target: arbitrary bytes as a .safetensors file. st_open must refuse them
 * with a message or accept a header whose every promise holds (safetensors.h): data section inside the mapping,
 * tensors sorted by name without overlaps, each byte range exactly shape x dtype size, every byte of every tensor
 * readable. A broken promise aborts (a finding), as does any sanitizer report. Build and run: tests/fuzz/build.sh
 * (seeds: tests/fuzz/seeds_safetensors/, small valid files and near misses).
 */
#include <unistd.h>

#include "fuzz_util.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/berth_fuzz_st_%d.safetensors", (int)getpid());
    if (!fuzz_write_file(path, data, size)) return 0;
    struct st_file *f = NULL;
    if (st_open(path, &f) != BERTH_OK) {
        fuzz_require_one_line_error();
        return 0;
    }
    fuzz_require(f->data_offset + f->data_size == f->map_size && f->map_size == size, "data section outside the file");
    uint64_t sum = 0, bytes = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        fuzz_require(i == 0 || strcmp(f->tensors[i - 1].name, t->name) < 0, "names sorted and unique");
        fuzz_require(t->begin <= t->end && t->end <= f->data_size, "byte range inside the data section");
        fuzz_require(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "rank");
        uint64_t n = t->elem_size;
        for (int d = 0; d < t->ndim; d++) {
            fuzz_require(t->shape[d] >= 0, "non-negative dimensions");
            n *= (uint64_t)t->shape[d];
        }
        fuzz_require(n == t->end - t->begin, "byte range = shape x dtype size");
        fuzz_require(st_find(f, t->name) == t, "st_find finds it");
        const unsigned char *p = st_tensor_data(f, t);
        for (uint64_t k = 0; k < t->end - t->begin; k++) /* out of the mapping: a fault */
            sum += p[k];
        bytes += t->end - t->begin;
    }
    /* no two byte ranges overlap (n^2 is fine at fuzz sizes) */
    for (int64_t i = 0; i < f->n_tensors; i++)
        for (int64_t j = 0; j < i; j++) {
            const struct st_tensor *t = &f->tensors[i], *u = &f->tensors[j];
            if (t->end > t->begin && u->end > u->begin)
                fuzz_require(t->end <= u->begin || u->end <= t->begin, "no overlapping tensors");
        }
    fuzz_require(bytes == f->tensor_bytes, "tensor_bytes is the sum of the ranges");
    (void)sum;
    st_close(f);
    return 0;
}

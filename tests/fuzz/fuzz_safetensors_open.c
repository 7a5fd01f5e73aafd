/*
 * fuzz_safetensors_open.c — libFuzzer target: arbitrary bytes as a .safetensors file. st_open must refuse them
 * with a message or accept a header whose every promise holds (safetensors.h): data section inside the mapping,
 * tensors sorted by name without overlaps, each byte range exactly shape x dtype size, every byte of every tensor
 * readable. A broken promise aborts (a finding), as does any sanitizer report. Build and run: tests/fuzz/build.sh
 * (seeds: tests/fuzz/seeds_safetensors/, small valid files and near misses).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "safetensors.h"

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_safetensors_open: accepted a file that breaks: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/berth_fuzz_st_%d.safetensors", (int)getpid());
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    fwrite(data, 1, size, fp);
    fclose(fp);
    struct st_file *f = NULL;
    if (st_open(path, &f) != BERTH_OK) {
        const char *msg = berth_last_error();
        check(msg && msg[0] && !strchr(msg, '\n'), "a refusal without a one-line message");
        return 0;
    }
    check(f->data_offset + f->data_size == f->map_size && f->map_size == size, "data section outside the file");
    uint64_t sum = 0, bytes = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        check(i == 0 || strcmp(f->tensors[i - 1].name, t->name) < 0, "names sorted and unique");
        check(t->begin <= t->end && t->end <= f->data_size, "byte range inside the data section");
        check(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "rank");
        uint64_t n = t->elem_size;
        for (int d = 0; d < t->ndim; d++) {
            check(t->shape[d] >= 0, "non-negative dimensions");
            n *= (uint64_t)t->shape[d];
        }
        check(n == t->end - t->begin, "byte range = shape x dtype size");
        check(st_find(f, t->name) == t, "st_find finds it");
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
                check(t->end <= u->begin || u->end <= t->begin, "no overlapping tensors");
        }
    check(bytes == f->tensor_bytes, "tensor_bytes is the sum of the ranges");
    (void)sum;
    st_close(f);
    return 0;
}

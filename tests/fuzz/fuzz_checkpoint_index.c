/*
 * fuzz_checkpoint_index.c — libFuzzer target: arbitrary bytes as a sharded checkpoint's
 * model.safetensors.index.json, beside a valid config.json and two valid shards (model-00001-of-00002.safetensors
 * with tensors a and b, model-00002-of-00002.safetensors with c). ckpt_open must refuse with a one-line message —
 * a weight_map naming files outside the folder, shards that do not exist, tensors listed under the wrong shard or
 * not at all — or open exactly the tensors its weight_map lists (a shard it does not name is not part of the
 * checkpoint). Build and run: tests/fuzz/build.sh
 * (seeds: tests/fuzz/seeds_index/).
 */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fuzz_util.h"

static int write_file(const char *dir, const char *name, const void *p, size_t n)
{
    char path[160];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fuzz_write_file(path, p, n);
}

/* A safetensors file: the 8-byte length, the header padded with spaces to a multiple of 8, data_len bytes. */
static int write_shard(const char *dir, const char *name, const char *header, size_t data_len)
{
    unsigned char buf[512];
    size_t hl = strlen(header), pad = (8 - hl % 8) % 8, n = 8 + hl + pad + data_len;
    if (n > sizeof buf) return 0;
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)(hl + pad) >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, ' ', pad);
    for (size_t i = 0; i < data_len; i++)
        buf[8 + hl + pad + i] = (unsigned char)(i * 29 + 3);
    return write_file(dir, name, buf, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/berth_fuzz_index_%d", (int)getpid());
        mkdir(dir, 0700);
        static const char cfg[] = "{\"model_type\": \"gemma4_text\"}";
        if (!write_file(dir, "config.json", cfg, sizeof cfg - 1) ||
            !write_shard(dir, "model-00001-of-00002.safetensors",
                         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}", 16) ||
            !write_shard(dir, "model-00002-of-00002.safetensors",
                         "{\"c\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]}}", 6)) {
            dir[0] = '\0';
            return 0;
        }
    }
    if (!write_file(dir, "model.safetensors.index.json", data, size)) return 0;
    berth_checkpoint *ck = NULL;
    if (ckpt_open(dir, &ck) != BERTH_OK) {
        if (getenv("FUZZ_VERBOSE")) /* reproduce one input by hand */
            fprintf(stderr, "fuzz_checkpoint_index: refused: %s\n", berth_last_error());
        fuzz_require_one_line_error();
        fuzz_require(ck == NULL, "a refusal that still returned a checkpoint");
        return 0;
    }
    json_t *index = json_loadb((const char *)data, size, 0, NULL);
    const json_t *wmap = json_object_get(index, "weight_map");
    fuzz_require(json_is_object(wmap) && ckpt_svc_tensor_count(NULL, ck) == (int64_t)json_object_size(wmap),
          "an accepted index whose weight_map does not list exactly the checkpoint's tensors");
    json_decref(index);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "fuzz_checkpoint_index: accepted\n");
    ckpt_close(ck);
    return 0;
}

/*
 * fuzz_gemma4_config.c — libFuzzer target: arbitrary bytes as a checkpoint's config.json, read the way a load reads
 * it: the host opens the folder (ckpt_open: config.json parsed, beside a valid empty model.safetensors), then the
 * Gemma 4 plugin's config code, through the real host services, checks model_type (g4_config_model_type) and
 * resolves every key the forward pass depends on (g4_config_parse). Each step must refuse with a one-line message
 * or succeed; a config the plugin accepts must keep the invariants the forward pass indexes with. The plugin's
 * sources are compiled in (no dlopen). Build and run: tests/fuzz/build.sh (seeds: tests/fuzz/seeds_gemma4_config/).
 */
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "fuzz_util.h"
#include "gemma4_config.h"
#include "host_services.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[64], cfg_path[96];
    if (!dir[0]) {
        host_log_set_level(BERTH_LOG_ERROR); /* warnings about odd configs are not findings */
        snprintf(dir, sizeof dir, "/tmp/berth_fuzz_g4_%d", (int)getpid());
        mkdir(dir, 0700);
        char st_path[96];
        snprintf(st_path, sizeof st_path, "%s/model.safetensors", dir);
        /* header "{}" padded to 8 bytes, no tensors */
        static const unsigned char st[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
        if (!fuzz_write_file(st_path, st, sizeof st)) return 0;
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    }
    if (!fuzz_write_file(cfg_path, data, size)) return 0;

    berth_checkpoint *ck = NULL;
    if (ckpt_open(dir, &ck) != BERTH_OK) {
        if (getenv("FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz_gemma4_config: refused: %s\n", berth_last_error());
        fuzz_require_one_line_error();
        return 0;
    }
    berth_host host;
    berth_host_ctx ctx;
    host_services_init(&host, &ctx, "gemma4", NULL);
    int multimodal = 0;
    if (g4_config_model_type(&host, ck, &multimodal) != BERTH_OK) {
        fuzz_require_one_line_error();
        ckpt_close(ck);
        return 0;
    }
    struct g4_config *cfg = NULL;
    if (g4_config_parse(&host, ck, &cfg) != BERTH_OK) {
        if (getenv("FUZZ_VERBOSE"))
            fprintf(stderr, "fuzz_gemma4_config: refused: %s\n", berth_last_error());
        fuzz_require_one_line_error();
        fuzz_require(cfg == NULL, "a refusal that still returned a config");
        ckpt_close(ck);
        return 0;
    }
    fuzz_require(cfg != NULL && cfg->layers != NULL, "success without a config");
    if (getenv("FUZZ_VERBOSE")) /* reproduce one input by hand: did it get this far */
        fprintf(stderr, "fuzz_gemma4_config: accepted, %d layers, %d KV groups\n", cfg->n_layers, cfg->n_kv_groups);
    /* what the forward pass and the KV layout index with */
    fuzz_require(cfg->n_layers >= 1 && cfg->hidden > 0 && cfg->n_heads > 0 && cfg->vocab > 0, "sizes");
    fuzz_require(cfg->n_kv_groups >= 0 && cfg->n_kv_groups <= G4_N_TYPES, "KV group count");
    for (int i = 0; i < cfg->n_layers; i++) {
        const struct g4_layer *l = &cfg->layers[i];
        fuzz_require(l->type >= 0 && l->type < G4_N_TYPES, "layer type");
        fuzz_require(l->head_dim > 0 && l->n_kv_heads > 0 && l->mlp_width > 0, "layer geometry");
        fuzz_require(l->kv_src >= 0 && l->kv_src < cfg->n_layers, "KV source layer in range");
        fuzz_require(!cfg->layers[l->kv_src].kv_shared, "KV source owns a cache");
        fuzz_require(l->kv_group >= 0 && l->kv_group < cfg->n_kv_groups, "KV group in range");
        fuzz_require(l->kv_index >= 0 && l->kv_index < cfg->group_layers[l->kv_group], "cache index inside its group");
    }
    g4_config_free(cfg);
    ckpt_close(ck);
    return 0;
}

/*
 * fuzz_config_load.c — libFuzzer target: arbitrary bytes as a berth INI config (config.h). config_load must refuse
 * them with a one-line "path:line: message" naming the file, or accept them; an accepted config is then read the
 * way the host reads it (every known section, a few keys, plugin paths resolved) and freed, under ASan + UBSan.
 * Build and run: tests/fuzz/build.sh (seeds: tests/fuzz/seeds_config/, the repository's configs).
 */
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "fuzz_util.h"

/* config.c's only use of the host services: warnings, dropped here */
void host_log(int32_t level, const char *fmt, ...)
{
    (void)level;
    (void)fmt;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char dir[64], path[96];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/berth_fuzz_cfg_%d", (int)getpid());
        mkdir(dir, 0700);
        snprintf(path, sizeof path, "%s/berth.ini", dir);
    }
    if (!fuzz_write_file(path, data, size)) return 0;
    struct berth_config *cfg = NULL;
    if (config_load(path, &cfg) != BERTH_OK) {
        const char *msg = berth_last_error();
        fuzz_require(msg && !strncmp(msg, path, strlen(path)) && !strchr(msg, '\n'),
              "a refusal whose message does not start with the file's path, or spans lines");
        fuzz_require(cfg == NULL, "a refusal that still returned a config");
        return 0;
    }
    static const char *const sections[] = {"plugins", "model", "kv", "scheduler", "server", "backend.cpu",
                                           "backend.cuda", "backend.metal"};
    static const char *const keys[] = {"dir", "enabled", "priority", "device", "compute", "threads", "memory"};
    for (size_t i = 0; i < sizeof sections / sizeof *sections; i++) {
        const struct cfg_section *sec = config_section(cfg, sections[i]);
        for (size_t k = 0; sec && k < sizeof keys / sizeof *keys; k++) {
            const char *v = cfg_section_get(sec, keys[k]);
            if (v) {
                char *r = config_resolve_path(cfg, v);
                free(r);
            }
        }
    }
    fuzz_require(cfg->kv_block_size > 0 && cfg->sched_max_batch_tokens > 0 && cfg->sched_max_seqs > 0,
          "an accepted config with a non-positive [kv] block_size or [scheduler] size");
    config_free(cfg);
    return 0;
}

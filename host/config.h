/*
 * config.h — the berth INI config (parsed with inih).
 *
 * Sections: [plugins] (dir = folder, repeatable; path = explicit .so, repeatable), [backend.NAME] (enabled,
 * priority, device, plus backend-specific keys handed to the plugin), [model] (path, plugin), [model.NAME]
 * (keys handed to model plugin NAME), [kv], [scheduler], [server]. Relative paths resolve against the folder of
 * the config file. Every error message starts with "file:line:" and names the key. docs/config.md lists which
 * problems are fatal, which reject one plugin, and which only warn.
 *
 * Lines are counted by our own reader (fed to ini_parse_stream), which also strips leading blanks so that inih
 * never treats an indented line as the continuation of the previous value.
 */
#ifndef BERTH_HOST_CONFIG_H
#define BERTH_HOST_CONFIG_H

#include <berth/plugin.h>
#include <stdint.h>

struct cfg_entry {
    char *key;
    char *value;
    int line;
};

struct cfg_section {
    char *name; /* "backend.cuda" */
    int line;
    struct cfg_entry *entries;
    int n_entries;
};

struct cfg_backend {
    char *name;                      /* NAME of [backend.NAME] */
    int enabled;                     /* default 1 */
    int priority;                    /* default 0; higher wins */
    int device;                      /* default 0 */
    const struct cfg_section *section;
    int line;
};

struct berth_config {
    char *path;   /* as given */
    char *dir;    /* folder of path, for resolving relative paths */
    struct cfg_section *sections;
    int n_sections;

    char **plugin_dirs;   /* resolved absolute-or-relative-to-cwd paths */
    int *plugin_dir_lines; /* line of each dir= (0 for the compiled-in default) */
    int n_plugin_dirs;
    char **plugin_paths;
    int *plugin_path_lines;
    int n_plugin_paths;
    int default_plugin_dir; /* 1 when there was no [plugins] section and plugin_dirs = {BERTH_DEFAULT_PLUGIN_DIR} */

    struct cfg_backend *backends;
    int n_backends;

    char *model_path;     /* [model] path, resolved; may be NULL */
    char *model_plugin;   /* [model] plugin: force a model plugin by name; may be NULL */
    int model_plugin_line;
    char *model_backend;  /* [model] backend: restrict selection to this backend (BERTH_BACKEND overrides) */
    int model_backend_line;

    int kv_block_size;         /* [kv] block_size, default 16 */
    uint64_t kv_memory_bytes;  /* [kv] memory (accepts K/M/G/KiB/MiB/GiB suffixes), default 512 MiB */
    int kv_dtype;              /* [kv] dtype: -1 = auto (the backend's preferred_kv_dtype), else BERTH_DTYPE_F32/BF16/F16 */
    int sched_max_batch_tokens;/* [scheduler] max_batch_tokens, default 512 */
    int sched_max_seqs;        /* [scheduler] max_seqs, default 64 */
    int sched_graphs;          /* [scheduler] graphs: replay decode steps as backend graphs when possible, default 1 */
    int sched_overlap;         /* [scheduler] overlap: 0 auto (default), 1 true, -1 false (runner.h, "Overlap") */
    char *server_host;         /* [server] host, default 127.0.0.1 */
    int server_port;           /* [server] port, default 8080 */

    char **warnings;           /* every warning config_load logged, "file:line: ..." (also sent to host_log) */
    int n_warnings;
};

/* Parse path. On failure returns an error with "path:line: message" (or "path: message") as last error. Warnings
 * (unknown key, missing optional plugin dir) go to the host log. Caller frees with config_free. */
berth_status config_load(const char *path, struct berth_config **out);
void config_free(struct berth_config *cfg);

/* Value of key in section, or NULL. A key given twice yields the last value. */
const char *cfg_section_get(const struct cfg_section *sec, const char *key);
/* Section by exact name, or NULL. */
const struct cfg_section *config_section(const struct berth_config *cfg, const char *name);
/* Resolve p against cfg->dir unless absolute. Caller frees. */
char *config_resolve_path(const struct berth_config *cfg, const char *p);

#endif

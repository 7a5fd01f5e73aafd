/*
 * registry.h — plugin discovery, loading, validation, probing and backend selection.
 *
 * The registry finds every .so named by the config ([plugins] dir/path), dlopen()s it (RTLD_NOW | RTLD_LOCAL),
 * checks magic, ABI major, struct sizes, required vtable members and required host services, probes backends,
 * and keeps a record of every plugin — loaded or rejected, and why — for `berth plugins`. It never dlclose()s.
 * Selection picks, for a checkpoint, the model plugin that accepts it and the highest-priority enabled backend
 * whose hardware is present and whose supports() covers every requirement of the model; BERTH_BACKEND=name
 * overrides the choice. Every decision is recorded with a reason.
 */
#ifndef BERTH_HOST_REGISTRY_H
#define BERTH_HOST_REGISTRY_H

#include <berth/model.h>

#include "config.h"
#include "host_services.h"

/* MISSING: an explicit [plugins] path= that does not exist (a warning, shown by `berth plugins`). */
enum plugin_state { PLUGIN_LOADED = 0, PLUGIN_REJECTED = 1, PLUGIN_MISSING = 2 };

struct plugin {
    char *path;
    int line;                          /* config line of the dir= / path= that named it (0: default dir) */
    enum plugin_state state;
    char reason[512];                  /* why rejected, or notes ("plugin ABI 1.1 is newer ... (accepted)") */
    const berth_plugin_desc *desc;     /* NULL if rejected before the descriptor was read */
    int kind;                          /* BERTH_PLUGIN_* (0 if unknown) */
    int abi_known;                     /* abi_major/minor were read from the descriptor (even if rejected) */
    unsigned abi_major, abi_minor;
    berth_host host;                   /* services table handed to this plugin */
    berth_host_ctx host_ctx;
    /* backends only: */
    const struct cfg_backend *cfg;     /* its [backend.NAME] section, or NULL if the config has none */
    berth_probe_info probe;
    berth_device_info *devices;        /* probe.n_devices entries */
};

struct registry {
    struct plugin *plugins;            /* allocated once: each plugin's host table points into its own entry */
    int n_plugins;
    const struct berth_config *cfg;
    int *dir_n_files;                  /* per cfg->plugin_dirs: .so files found there, -1 if it was unreadable */
    char **warnings;                   /* warnings registry_load logged (missing folder / path) */
    int n_warnings;
};

/* A backend's [backend.NAME] settings, or the defaults (enabled, priority 0, device 0) without a section. */
int plugin_enabled(const struct plugin *p);
int plugin_priority(const struct plugin *p);
int plugin_device(const struct plugin *p);

/* Discover and load every plugin the config names. Per-plugin problems reject that plugin and continue; only a
 * fatal problem (e.g. BERTH_BACKEND names an unknown backend) fails. Caller frees with registry_free (which
 * destroys nothing a selection created and never dlclose()s). */
berth_status registry_load(const struct berth_config *cfg, struct registry **out);
void registry_free(struct registry *reg);

/* The loaded plugin of that kind and name, or NULL. */
struct plugin *registry_find(struct registry *reg, int kind, const char *name);

/* The outcome of choosing how to run one checkpoint. */
struct selection {
    struct plugin *model_plugin;
    struct plugin *backend_plugin;
    int device;
    berth_model *model;                /* created (not yet loaded) */
    berth_backend *backend;            /* the chosen backend, initialised on `device`; owned by the selection */
    berth_backend_api api;             /* what to hand the model's load(); api.device points into backend_plugin */
    char why[4096];                    /* multi-line: why this backend/model, and why each other was not chosen */
};

/* Choose the model plugin and backend for an opened checkpoint and create the model. On failure the last error
 * says why (e.g. no model plugin accepts model_type X; no usable backend, with each backend's reason), nothing
 * stays created, and why still holds the reasons gathered so far. */
berth_status registry_select(struct registry *reg, const berth_checkpoint *ck, struct selection *out);
/* Destroy the model a selection created (and nothing else). With weights loaded, the order is:
 * selection_destroy_model, then ckpt_close (it frees weight buffers through the backend), then selection_release. */
void selection_destroy_model(struct selection *sel);
/* Destroy what the selection still holds: the model, then the backend. Call before registry_free. Accepts a
 * zeroed selection and may be called twice. */
void selection_release(struct selection *sel);

#endif

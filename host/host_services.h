/*
 * host_services.h — the struct berth_host table handed to plugins, and the per-plugin context behind it.
 *
 * Each loaded plugin gets its own berth_host_ctx (its name for log tags, its INI section for config_get) and
 * its own berth_host table pointing at it. set_error from a plugin lands in the host's thread-local last error
 * (errors.h), so the code that called the plugin reports it.
 */
#ifndef BERTH_HOST_SERVICES_H
#define BERTH_HOST_SERVICES_H

#include <berth/plugin.h>

struct cfg_section; /* config.h */

struct berth_host_ctx {
    char plugin_name[64];
    const struct cfg_section *section; /* the plugin's own [backend.NAME] / [model.NAME]; may be NULL */
};

/* Fill *host for a plugin named name reading section (may be NULL). ctx must outlive host. */
void host_services_init(berth_host *host, berth_host_ctx *ctx, const char *name, const struct cfg_section *section);

/* Minimum level printed by the host logger (BERTH_LOG_*); default BERTH_LOG_WARN; -v = INFO, -vv = DEBUG. */
void host_log_set_level(int32_t level);
/* Log a line from the host itself (stderr, tagged "berth:"). */
void host_log(int32_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif

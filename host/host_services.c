/*
 * host_services.c — the berth_host table every plugin gets, and the host's stderr logger.
 *
 * One table per loaded plugin, pointing at that plugin's berth_host_ctx (its name for log tags, its INI section
 * for config_get). Log lines are written with one fputs each so lines from plugin worker threads never interleave.
 */
#include "host_services.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "checkpoint.h"
#include "config.h"
#include "errors.h"

#ifndef BERTH_VERSION
#define BERTH_VERSION "0.0.0"
#endif

/* Set by the CLI before any plugin runs; read from any thread afterwards. */
static _Atomic int32_t log_level = BERTH_LOG_WARN;

void host_log_set_level(int32_t level)
{
    if (level < BERTH_LOG_ERROR)
        level = BERTH_LOG_ERROR;
    if (level > BERTH_LOG_DEBUG)
        level = BERTH_LOG_DEBUG;
    log_level = level;
}

/* Write "berth: <prefix><msg>\n" as one line: trailing newlines dropped, inner ones flattened. */
static void emit_line(const char *prefix, const char *msg)
{
    char line[2048];
    int n = snprintf(line, sizeof line, "berth: %s%s", prefix, msg ? msg : "(null)");
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    for (size_t i = 0; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[len++] = '\n';
    line[len] = '\0';
    fputs(line, stderr);
}

static const char *level_prefix(int32_t level)
{
    switch (level) {
    case BERTH_LOG_ERROR: return "error: ";
    case BERTH_LOG_WARN: return "warning: ";
    case BERTH_LOG_DEBUG: return "debug: ";
    default: return "";
    }
}

void host_log(int32_t level, const char *fmt, ...)
{
    if (level > log_level)
        return;
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit_line(level_prefix(level), msg);
}

/* --- BERTH_SVC_LOG ----------------------------------------------------------------------------------------- */

static void svc_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    if (level > log_level)
        return;
    char prefix[80];
    snprintf(prefix, sizeof prefix, "[%s] ", ctx && ctx->plugin_name[0] ? ctx->plugin_name : "?");
    emit_line(prefix, msg);
}

static void svc_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    berth_fail(code, "%s", msg ? msg : "(no message)");
}

/* --- BERTH_SVC_CONFIG -------------------------------------------------------------------------------------- */

static const char *svc_config_get(berth_host_ctx *ctx, const char *key)
{
    return ctx ? cfg_section_get(ctx->section, key) : NULL;
}

static berth_status svc_config_at(berth_host_ctx *ctx, int32_t idx, const char **key, const char **value)
{
    const struct cfg_section *sec = ctx ? ctx->section : NULL;
    if (!sec || idx < 0 || idx >= sec->n_entries)
        return BERTH_E_NOT_FOUND;
    if (key)
        *key = sec->entries[idx].key;
    if (value)
        *value = sec->entries[idx].value;
    return BERTH_OK;
}

void host_services_init(berth_host *host, berth_host_ctx *ctx, const char *name, const struct cfg_section *section)
{
    memset(ctx, 0, sizeof *ctx);
    snprintf(ctx->plugin_name, sizeof ctx->plugin_name, "%s", name ? name : "?");
    ctx->section = section;

    memset(host, 0, sizeof *host);
    host->struct_size = (uint32_t)sizeof *host;
    host->abi_major = BERTH_ABI_MAJOR;
    host->abi_minor = BERTH_ABI_MINOR;
    host->host_version = BERTH_VERSION;
    host->ctx = ctx;
    host->services = BERTH_SVC_KNOWN_MASK;
    host->log = svc_log;
    host->set_error = svc_set_error;
    host->config_get = svc_config_get;
    host->config_at = svc_config_at;
    host->ckpt_cfg_type = ckpt_svc_cfg_type;
    host->ckpt_cfg_int = ckpt_svc_cfg_int;
    host->ckpt_cfg_real = ckpt_svc_cfg_real;
    host->ckpt_cfg_bool = ckpt_svc_cfg_bool;
    host->ckpt_cfg_string = ckpt_svc_cfg_string;
    host->ckpt_cfg_len = ckpt_svc_cfg_len;
    host->ckpt_cfg_key = ckpt_svc_cfg_key;
    host->ckpt_dir = ckpt_svc_dir;
    host->ckpt_tensor_count = ckpt_svc_tensor_count;
    host->ckpt_tensor_at = ckpt_svc_tensor_at;
    host->ckpt_tensor_find = ckpt_svc_tensor_find;
    host->tensor_load = ckpt_svc_tensor_load;
}

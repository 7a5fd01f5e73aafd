/*
 * cmd_plugins.c — `berth plugins --config F [--model DIR]`: what the registry found and what it would choose.
 *
 * Everything goes to stdout except warnings and the one-line fatal error (stderr, through the host log). Exit 0
 * when the listing worked, even if plugins were rejected: rejecting a bad plugin is the loader doing its job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "commands.h"
#include "config.h"
#include "errors.h"
#include "host_services.h"
#include "registry.h"

static const char plugins_usage[] =
    "usage: berth plugins --config FILE [--model DIR] [-v | -vv]\n"
    "  --config FILE   the berth INI config whose [plugins] to load\n"
    "  --model DIR     also show which model plugin and backend would run the checkpoint in DIR, and why\n";

static const char *state_word(enum plugin_state s)
{
    return s == PLUGIN_LOADED ? "loaded" : s == PLUGIN_MISSING ? "missing" : "rejected";
}

static void print_gib(FILE *f, uint64_t bytes)
{
    fprintf(f, "%.1f GiB", (double)bytes / (double)(1ull << 30));
}

static void print_dtypes(FILE *f, uint32_t bits)
{
    static const char *const names[BERTH_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "i64", "u8"};
    int n = 0;
    for (int t = 0; t < 32; t++) {
        if (!(bits >> t & 1))
            continue;
        if (t < BERTH_DTYPE_COUNT)
            fprintf(f, "%s%s", n++ ? " " : "", names[t]);
        else
            fprintf(f, "%sdtype%d", n++ ? " " : "", t);
    }
    if (!n)
        fputs("none", f);
}

static void print_caps(FILE *f, uint64_t caps)
{
    static const char *const names[] = {"wrap_host", "host_visible", "async", "graphs"};
    int n = 0;
    for (int b = 0; b < 64; b++) {
        if (!(caps >> b & 1))
            continue;
        if (b < (int)(sizeof names / sizeof names[0]))
            fprintf(f, "%s%s", n++ ? " " : "", names[b]);
        else
            fprintf(f, "%sbit%d", n++ ? " " : "", b);
    }
    if (!n)
        fputs("none", f);
}

static const char *desc_name(const struct plugin *p)
{
    return p->desc && p->desc->name ? p->desc->name : "-";
}

static const char *desc_version(const struct plugin *p)
{
    return p->desc && p->desc->version ? p->desc->version : "-";
}

static const char *kind_col(const struct plugin *p)
{
    return p->kind == BERTH_PLUGIN_BACKEND ? "backend" : p->kind == BERTH_PLUGIN_MODEL ? "model" : "-";
}

static void print_backend_details(FILE *f, const struct plugin *p, const char *pad)
{
    if (p->cfg)
        fprintf(f, "%sconfig: [backend.%s] line %d: %s, priority %d, device %d\n", pad, p->desc->name, p->cfg->line,
                plugin_enabled(p) ? "enabled" : "disabled", plugin_priority(p), plugin_device(p));
    else
        fprintf(f, "%sconfig: no [backend.%s] section: enabled, priority 0, device 0\n", pad, p->desc->name);
    if (p->probe.n_devices == 0) {
        fprintf(f, "%sdevices: 0 (%s)\n", pad, p->probe.message[0] ? p->probe.message : "no reason given");
        return;
    }
    fprintf(f, "%sdevices: %d\n", pad, p->probe.n_devices);
    for (int i = 0; i < p->probe.n_devices && p->devices; i++) {
        const berth_device_info *d = &p->devices[i];
        fprintf(f, "%s  [%d] %s: ", pad, i, d->name);
        print_gib(f, d->total_memory);
        fputs(" (", f);
        print_gib(f, d->free_memory);
        fprintf(f, " free), %d compute units\n", d->compute_units);
        fprintf(f, "%s      caps: ", pad);
        print_caps(f, d->caps);
        fputs("; weights: ", f);
        print_dtypes(f, d->weight_dtypes);
        fputs("; activations: ", f);
        print_dtypes(f, d->act_dtypes);
        fputs("; kv: ", f);
        print_dtypes(f, d->kv_dtypes);
        fputc('\n', f);
    }
}

static void print_model_details(FILE *f, const struct plugin *p, const char *pad)
{
    const berth_model_vtable *vt = p->desc->vtable;
    fprintf(f, "%smodel types:", pad);
    int n = 0;
    if (BERTH_HAS(vt, berth_model_vtable, model_types) && vt->model_types)
        for (const char *const *t = vt->model_types; *t && n < 64; t++)
            fprintf(f, " %s", *t), n++;
    fputs(n ? "\n" : " (not listed)\n", f);
}

static void print_listing(FILE *f, const struct berth_config *cfg, const struct registry *reg)
{
    fprintf(f, "berth %s (plugin ABI %d.%d), config %s\n\n", BERTH_VERSION, BERTH_ABI_MAJOR, BERTH_ABI_MINOR,
            cfg->path);

    fputs("Plugin folders:\n", f);
    for (int i = 0; i < cfg->n_plugin_dirs; i++) {
        int n = reg->dir_n_files ? reg->dir_n_files[i] : 0;
        fprintf(f, "  %s: ", cfg->plugin_dirs[i]);
        if (n < 0)
            fputs("unreadable (skipped)", f);
        else
            fprintf(f, "%d plugin file%s", n, n == 1 ? "" : "s");
        fputs(cfg->default_plugin_dir ? " (compiled-in default)\n" : "\n", f);
    }
    if (!cfg->n_plugin_dirs)
        fputs("  (none)\n", f);

    int n_loaded = 0;
    size_t w_name = 4, w_ver = 7;
    for (int i = 0; i < reg->n_plugins; i++) {
        const struct plugin *p = &reg->plugins[i];
        n_loaded += p->state == PLUGIN_LOADED;
        if (strlen(desc_name(p)) > w_name)
            w_name = strlen(desc_name(p));
        if (strlen(desc_version(p)) > w_ver)
            w_ver = strlen(desc_version(p));
    }
    if (w_name > 24)
        w_name = 24;
    if (w_ver > 16)
        w_ver = 16;
    fprintf(f, "\nPlugins: %d found, %d loaded\n", reg->n_plugins, n_loaded);
    if (!reg->n_plugins)
        return;
    fprintf(f, "  %-8s  %-7s  %-*s  %-*s  %-5s  %s\n", "STATUS", "KIND", (int)w_name, "NAME", (int)w_ver, "VERSION",
            "ABI", "PATH");
    for (int i = 0; i < reg->n_plugins; i++) {
        const struct plugin *p = &reg->plugins[i];
        char abi[24] = "-";
        if (p->abi_known)
            snprintf(abi, sizeof abi, "%u.%u", p->abi_major, p->abi_minor);
        fprintf(f, "  %-8s  %-7s  %-*.*s  %-*.*s  %-5s  %s\n", state_word(p->state), kind_col(p), (int)w_name,
                (int)w_name, desc_name(p), (int)w_ver, (int)w_ver, desc_version(p), abi, p->path);
        const char *pad = "            ";
        if (p->state != PLUGIN_LOADED) {
            fprintf(f, "%swhy: %s\n", pad, p->reason);
            continue;
        }
        if (p->reason[0])
            fprintf(f, "%snote: %s\n", pad, p->reason);
        if (p->desc->description)
            fprintf(f, "%s%s\n", pad, p->desc->description);
        if (p->kind == BERTH_PLUGIN_BACKEND)
            print_backend_details(f, p, pad);
        else
            print_model_details(f, p, pad);
    }

    /* Config sections for backends nothing provides: usually a plugin that was not built or not found. */
    int header = 0;
    for (int i = 0; i < cfg->n_backends; i++) {
        const char *name = cfg->backends[i].name;
        if (registry_find((struct registry *)reg, BERTH_PLUGIN_BACKEND, name))
            continue;
        if (!header++)
            fputs("\nConfigured backends without a loaded plugin:\n", f);
        fprintf(f, "  [backend.%s] (%s:%d)\n", name, cfg->path, cfg->backends[i].line);
    }
}

static int run_model(FILE *f, struct registry *reg, const char *dir)
{
    berth_checkpoint *ck = NULL;
    if (ckpt_open(dir, &ck) != BERTH_OK) {
        host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
        return 1;
    }
    struct selection sel;
    berth_status st = registry_select(reg, ck, &sel);
    fprintf(f, "\nSelection for %s:\n%s", dir, sel.why);
    int rc = 0;
    if (st != BERTH_OK) {
        fflush(f);
        host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
        rc = 1;
    }
    selection_destroy_model(&sel);
    ckpt_close(ck); /* before the backend goes: checkpoint.h's order */
    selection_release(&sel);
    return rc;
}

/* "--name value" or "--name=value". Returns the value and advances *i, or NULL if argv[*i] is not this option. */
static const char *option_value(int argc, char **argv, int *i, const char *name, int *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int cmd_plugins(int argc, char **argv)
{
    const char *config_path = NULL, *model_dir = NULL;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if ((v = option_value(argc, argv, &i, "--config", &missing))) {
            config_path = v;
        } else if ((v = option_value(argc, argv, &i, "--model", &missing))) {
            model_dir = v;
        } else if (missing) {
            fprintf(stderr, "berth plugins: %s needs a value\n%s", argv[i], plugins_usage);
            return 2;
        } else if (strcmp(argv[i], "-v") == 0) {
            host_log_set_level(BERTH_LOG_INFO);
        } else if (strcmp(argv[i], "-vv") == 0) {
            host_log_set_level(BERTH_LOG_DEBUG);
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(plugins_usage, stdout);
            return 0;
        } else {
            fprintf(stderr, "berth plugins: unknown argument '%s'\n%s", argv[i], plugins_usage);
            return 2;
        }
    }
    if (!config_path) {
        fprintf(stderr, "berth plugins: --config FILE is required\n%s", plugins_usage);
        return 2;
    }

    struct berth_config *cfg = NULL;
    if (config_load(config_path, &cfg) != BERTH_OK) {
        host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
        return 1;
    }
    struct registry *reg = NULL;
    if (registry_load(cfg, &reg) != BERTH_OK) {
        host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
        config_free(cfg);
        return 1;
    }
    print_listing(stdout, cfg, reg);
    int rc = model_dir ? run_model(stdout, reg, model_dir) : 0;
    fflush(stdout);
    registry_free(reg);
    config_free(cfg);
    return rc;
}

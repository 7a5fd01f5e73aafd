/*
 * registry.c — find, load, validate and probe plugins; choose the model plugin and backend for a checkpoint.
 *
 * Every plugin named by the config gets a record, loaded or not, with a one-line reason, because `berth plugins`
 * must explain every file it saw. A problem with one plugin never stops the others. Nothing is ever dlclose()d:
 * device runtimes register handlers that outlive an unload.
 */
#include "registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "errors.h"

/* More devices than this from probe() means a broken plugin, not a big machine. */
#define MAX_DEVICES 4096

typedef void (*any_fn)(void);

static void set_reason(struct plugin *p, enum plugin_state st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_reason(struct plugin *p, enum plugin_state st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->reason, sizeof p->reason, fmt, ap);
    va_end(ap);
    p->state = st;
}

/* Append a note to a loaded plugin's reason ("; "-separated). */
static void add_note(struct plugin *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(struct plugin *p, const char *fmt, ...)
{
    size_t n = strlen(p->reason);
    if (n && n + 2 < sizeof p->reason) {
        memcpy(p->reason + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->reason + n, sizeof p->reason - n, fmt, ap);
    va_end(ap);
}

/* The message a plugin left with set_error, or a stand-in when it left none. Points into the last-error slot:
 * copy it (saved_plugin_msg) before passing it to berth_fail, which overwrites that slot. */
static const char *plugin_msg(void)
{
    const char *m = berth_last_error();
    return m[0] ? m : "(the plugin gave no message)";
}

static const char *saved_plugin_msg(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", plugin_msg());
    return buf;
}

static const char *kind_word(int kind)
{
    return kind == BERTH_PLUGIN_BACKEND ? "backend" : kind == BERTH_PLUGIN_MODEL ? "model" : "plugin";
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Descriptor and vtable checks */

struct member {
    const char *name;
    size_t off;
};
#define MEMBER(type, field) {#field, offsetof(type, field)}

static const struct member backend_required[] = {
    MEMBER(berth_backend_vtable, probe),          MEMBER(berth_backend_vtable, device_info),
    MEMBER(berth_backend_vtable, init),           MEMBER(berth_backend_vtable, destroy),
    MEMBER(berth_backend_vtable, supports),       MEMBER(berth_backend_vtable, get_ops),
    MEMBER(berth_backend_vtable, stream_create),  MEMBER(berth_backend_vtable, stream_destroy),
    MEMBER(berth_backend_vtable, stream_sync),    MEMBER(berth_backend_vtable, buffer_alloc),
    MEMBER(berth_backend_vtable, buffer_free),    MEMBER(berth_backend_vtable, buffer_upload),
    MEMBER(berth_backend_vtable, buffer_download), MEMBER(berth_backend_vtable, buffer_copy),
    MEMBER(berth_backend_vtable, buffer_fill),
};
static const struct member model_required[] = {
    MEMBER(berth_model_vtable, accept),        MEMBER(berth_model_vtable, create),
    MEMBER(berth_model_vtable, destroy),       MEMBER(berth_model_vtable, info),
    MEMBER(berth_model_vtable, memory_layout), MEMBER(berth_model_vtable, requirements),
    MEMBER(berth_model_vtable, load),          MEMBER(berth_model_vtable, forward),
};

static any_fn member_at(const void *table, size_t off)
{
    any_fn f;
    memcpy(&f, (const char *)table + off, sizeof f);
    return f;
}

/* Names of the op ids, for messages; ops newer than the host print as "op N". */
static const char *const op_names[BERTH_OP_COUNT] = {
    "matmul", "get_rows", "rms_norm", "layer_norm", "rope", "unary", "glu", "binary",
    "copy", "kv_append", "attention", "conv1d_causal", "gated_delta", "gated_rms_norm", "log_softmax_topk", "sample",
};

static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Check the vtable of an accepted descriptor. Returns 1 if usable, else sets the reason. */
static int check_vtable(struct plugin *p)
{
    const berth_plugin_desc *d = p->desc;
    const char *kw = kind_word(d->kind);
    if (!d->vtable) {
        set_reason(p, PLUGIN_REJECTED, "%s vtable is NULL", kw);
        return 0;
    }
    const struct member *req = d->kind == BERTH_PLUGIN_BACKEND ? backend_required : model_required;
    size_t n_req = d->kind == BERTH_PLUGIN_BACKEND ? sizeof backend_required / sizeof backend_required[0]
                                                     : sizeof model_required / sizeof model_required[0];
    size_t need = 0;
    for (size_t i = 0; i < n_req; i++)
        if (req[i].off + sizeof(any_fn) > need)
            need = req[i].off + sizeof(any_fn);
    uint32_t have = *(const uint32_t *)d->vtable; /* every vtable starts with struct_size */
    if (have < need) {
        set_reason(p, PLUGIN_REJECTED, "%s vtable struct_size %u is too small (ABI %d.%d needs at least %zu)", kw,
                   have, BERTH_ABI_MAJOR, BERTH_ABI_MINOR, need);
        return 0;
    }
    for (size_t i = 0; i < n_req; i++) {
        if (!member_at(d->vtable, req[i].off)) {
            set_reason(p, PLUGIN_REJECTED, "%s vtable member '%s' is NULL", kw, req[i].name);
            return 0;
        }
    }
    return 1;
}

/* Service bits this host lacks, as "bit 4 (0x10), bit 9 (0x200)". */
static void describe_bits(uint64_t bits, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int b = 0; b < 64 && n < cap; b++) {
        if (!(bits >> b & 1))
            continue;
        int w = snprintf(buf + n, cap - n, "%sbit %d (0x%llx)", n ? ", " : "", b, (unsigned long long)1 << b);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

static const struct plugin *find_loaded(const struct registry *reg, int upto, int kind, const char *name)
{
    for (int i = 0; i < upto; i++) {
        const struct plugin *q = &reg->plugins[i];
        if (q->state == PLUGIN_LOADED && q->kind == kind && strcmp(q->desc->name, name) == 0)
            return q;
    }
    return NULL;
}

static const struct cfg_backend *config_backend(const struct berth_config *cfg, const char *name)
{
    for (int i = 0; i < cfg->n_backends; i++)
        if (strcmp(cfg->backends[i].name, name) == 0)
            return &cfg->backends[i];
    return NULL;
}

/* Ask a loaded backend what hardware it sees. */
static void probe_backend(struct plugin *p)
{
    const berth_backend_vtable *vt = p->desc->vtable;
    memset(&p->probe, 0, sizeof p->probe);
    p->probe.struct_size = (uint32_t)sizeof p->probe;
    berth_clear_error();
    berth_status st = vt->probe(&p->host, &p->probe);
    p->probe.message[sizeof p->probe.message - 1] = '\0';
    if (st != BERTH_OK) {
        set_reason(p, PLUGIN_REJECTED, "probe failed: %s", plugin_msg());
        return;
    }
    if (p->probe.n_devices < 0 || p->probe.n_devices > MAX_DEVICES) {
        set_reason(p, PLUGIN_REJECTED, "probe reported %d devices", p->probe.n_devices);
        return;
    }
    if (p->probe.n_devices == 0) {
        add_note(p, "no devices: %s", p->probe.message[0] ? p->probe.message : "(the plugin gave no reason)");
        return;
    }
    p->devices = calloc((size_t)p->probe.n_devices, sizeof *p->devices);
    if (!p->devices) {
        set_reason(p, PLUGIN_REJECTED, "out of memory");
        return;
    }
    for (int i = 0; i < p->probe.n_devices; i++) {
        berth_device_info *di = &p->devices[i];
        di->struct_size = (uint32_t)sizeof *di;
        di->index = i;
        berth_clear_error();
        st = vt->device_info(&p->host, i, di);
        di->name[sizeof di->name - 1] = '\0';
        if (st != BERTH_OK) {
            set_reason(p, PLUGIN_REJECTED, "device_info(%d) failed: %s", i, plugin_msg());
            free(p->devices);
            p->devices = NULL;
            return;
        }
    }
}

/* dlopen and validate one plugin file; p->path is set, the rest zeroed. */
static void load_one(struct registry *reg, int idx)
{
    struct plugin *p = &reg->plugins[idx];
    void *h = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        set_reason(p, PLUGIN_REJECTED, "%s", e ? e : "dlopen failed");
        return;
    }
    /* From here on h stays open even when rejected: we never dlclose. */
    dlerror();
    void *sym = dlsym(h, BERTH_PLUGIN_ENTRY_SYMBOL);
    if (!sym) {
        set_reason(p, PLUGIN_REJECTED, "not a berth plugin: no %s symbol", BERTH_PLUGIN_ENTRY_SYMBOL);
        return;
    }
    berth_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    const berth_plugin_desc *d = entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    if (!d) {
        set_reason(p, PLUGIN_REJECTED, "%s returned NULL (the plugin does not serve host ABI %d.%d)",
                   BERTH_PLUGIN_ENTRY_SYMBOL, BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
        return;
    }
    if (d->magic != BERTH_PLUGIN_MAGIC) {
        set_reason(p, PLUGIN_REJECTED, "bad magic 0x%08x (expected 0x%08x)", (unsigned)d->magic,
                   (unsigned)BERTH_PLUGIN_MAGIC);
        return;
    }
    const size_t need_version = BERTH_SIZE_TO(berth_plugin_desc, abi_minor);
    const size_t need_all = BERTH_SIZE_TO(berth_plugin_desc, vtable);
    if (d->struct_size < need_version) {
        set_reason(p, PLUGIN_REJECTED, "descriptor struct_size %u is too small (ABI %d.%d needs at least %zu)",
                   (unsigned)d->struct_size, BERTH_ABI_MAJOR, BERTH_ABI_MINOR, need_all);
        return;
    }
    p->abi_known = 1;
    p->abi_major = d->abi_major;
    p->abi_minor = d->abi_minor;
    if (d->abi_major != BERTH_ABI_MAJOR) {
        set_reason(p, PLUGIN_REJECTED, "ABI major mismatch: plugin ABI %u.%u, host ABI %d.%d",
                   (unsigned)d->abi_major, (unsigned)d->abi_minor, BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
        return;
    }
    /* A minor older than BERTH_ABI_MINOR_MIN would be misread (0.x minors could change layouts or add fields a
     * caller relies on, plugin.h): reject it and say to rebuild. In 1.x the minimum is 0 and this never fires; the
     * minimum goes through a variable so that the always-false comparison does not trip -Wtype-limits. */
    const unsigned minor_min = BERTH_ABI_MINOR_MIN;
    if (d->abi_minor < minor_min) {
        set_reason(p, PLUGIN_REJECTED, "plugin ABI %u.%u predates host ABI %d.%d (minors older than %d.%d are "
                   "not compatible): rebuild the plugin", (unsigned)d->abi_major, (unsigned)d->abi_minor,
                   BERTH_ABI_MAJOR, BERTH_ABI_MINOR, BERTH_ABI_MAJOR, BERTH_ABI_MINOR_MIN);
        return;
    }
    if (d->struct_size < need_all) {
        set_reason(p, PLUGIN_REJECTED, "descriptor struct_size %u is too small (ABI %d.%d needs at least %zu)",
                   (unsigned)d->struct_size, BERTH_ABI_MAJOR, BERTH_ABI_MINOR, need_all);
        return;
    }
    p->desc = d;
    if (d->kind != BERTH_PLUGIN_BACKEND && d->kind != BERTH_PLUGIN_MODEL) {
        set_reason(p, PLUGIN_REJECTED, "unknown plugin kind %d", (int)d->kind);
        return;
    }
    p->kind = d->kind;
    if (!d->name) {
        set_reason(p, PLUGIN_REJECTED, "descriptor name is NULL");
        return;
    }
    if (!valid_name(d->name)) {
        set_reason(p, PLUGIN_REJECTED, "invalid plugin name '%.64s' (1 to 63 letters, digits, '_' or '-')",
                   d->name);
        return;
    }
    if (!d->version) {
        set_reason(p, PLUGIN_REJECTED, "descriptor version is NULL");
        return;
    }
    uint64_t missing = d->required_services & ~(uint64_t)BERTH_SVC_KNOWN_MASK;
    if (missing) {
        char bits[256];
        describe_bits(missing, bits, sizeof bits);
        set_reason(p, PLUGIN_REJECTED, "requires host service %s that host ABI %d.%d does not provide", bits,
                   BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
        return;
    }
    if (!check_vtable(p))
        return;
    const struct plugin *first = find_loaded(reg, idx, d->kind, d->name);
    if (first) {
        set_reason(p, PLUGIN_REJECTED, "duplicate %s name '%s' (already loaded from %s)", kind_word(d->kind),
                   d->name, first->path);
        return;
    }

    p->state = PLUGIN_LOADED;
    p->reason[0] = '\0';
    if (d->abi_minor > BERTH_ABI_MINOR)
        add_note(p, "plugin ABI %u.%u is newer than host ABI %d.%d (accepted)", (unsigned)d->abi_major,
                 (unsigned)d->abi_minor, BERTH_ABI_MAJOR, BERTH_ABI_MINOR);

    char sec_name[80];
    snprintf(sec_name, sizeof sec_name, "%s.%s", kind_word(d->kind), d->name);
    host_services_init(&p->host, &p->host_ctx, d->name, config_section(reg->cfg, sec_name));
    if (d->kind == BERTH_PLUGIN_BACKEND) {
        p->cfg = config_backend(reg->cfg, d->name);
        probe_backend(p);
    }
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Discovery */

struct candidate {
    char *path;
    int line;
    int err; /* errno of stat() for a missing explicit path, else 0 */
};

struct cand_list {
    struct candidate *v;
    int n;
};

static int push_candidate(struct cand_list *l, char *path, int line, int err)
{
    struct candidate *v = realloc(l->v, sizeof *v * (size_t)(l->n + 1));
    if (!v) {
        free(path);
        return 0;
    }
    l->v = v;
    l->v[l->n++] = (struct candidate){path, line, err};
    return 1;
}

static int ends_with_so(const struct dirent *e)
{
    size_t n = strlen(e->d_name);
    return n > 3 && strcmp(e->d_name + n - 3, ".so") == 0;
}

/* Byte order, not the locale's, so listings are the same everywhere. */
static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int add_warning(struct registry *reg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_warning(struct registry *reg, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    host_log(BERTH_LOG_WARN, "%s", msg);
    char *c = strdup(msg);
    char **w = c ? realloc(reg->warnings, sizeof *w * (size_t)(reg->n_warnings + 1)) : NULL;
    if (!w) {
        free(c);
        return 0;
    }
    reg->warnings = w;
    reg->warnings[reg->n_warnings++] = c;
    return 1;
}

static char *join_path(const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    int slash = dl && dir[dl - 1] != '/';
    char *r = malloc(dl + (size_t)slash + nl + 1);
    if (!r)
        return NULL;
    memcpy(r, dir, dl);
    if (slash)
        r[dl] = '/';
    memcpy(r + dl + slash, name, nl + 1);
    return r;
}

/* The .so files of one folder, in name order. Returns 0 only when out of memory. */
static int scan_dir(struct registry *reg, int i, struct cand_list *out)
{
    const struct berth_config *cfg = reg->cfg;
    const char *dir = cfg->plugin_dirs[i];
    struct dirent **names = NULL;
    int n = scandir(dir, &names, ends_with_so, by_name);
    if (n < 0) {
        reg->dir_n_files[i] = -1;
        if (cfg->plugin_dir_lines[i] > 0)
            return add_warning(reg, "%s:%d: [plugins] dir '%s': %s (skipped)", cfg->path, cfg->plugin_dir_lines[i],
                               dir, strerror(errno));
        return add_warning(reg, "%s: no [plugins] section and the default plugin folder '%s' is unusable: %s",
                           cfg->path, dir, strerror(errno));
    }
    int ok = 1, found = 0;
    for (int k = 0; k < n; k++) {
        char *full = ok ? join_path(dir, names[k]->d_name) : NULL;
        struct stat sb;
        if (full && stat(full, &sb) == 0 && S_ISREG(sb.st_mode)) {
            found++;
            ok = push_candidate(out, full, cfg->plugin_dir_lines[i], 0);
        } else {
            if (ok && !full)
                ok = 0;
            free(full);
        }
        free(names[k]);
    }
    free(names);
    reg->dir_n_files[i] = found;
    return ok;
}

static berth_status discover(struct registry *reg, struct cand_list *cands)
{
    const struct berth_config *cfg = reg->cfg;
    if (cfg->n_plugin_dirs) {
        reg->dir_n_files = calloc((size_t)cfg->n_plugin_dirs, sizeof *reg->dir_n_files);
        if (!reg->dir_n_files)
            return BERTH_E_NOMEM;
    }
    for (int i = 0; i < cfg->n_plugin_dirs; i++)
        if (!scan_dir(reg, i, cands))
            return BERTH_E_NOMEM;
    for (int i = 0; i < cfg->n_plugin_paths; i++) {
        const char *path = cfg->plugin_paths[i];
        struct stat sb;
        int err = stat(path, &sb) == 0 ? 0 : errno;
        if (err && !add_warning(reg, "%s:%d: [plugins] path '%s': %s (skipped)", cfg->path,
                                cfg->plugin_path_lines[i], path, strerror(err)))
            return BERTH_E_NOMEM;
        char *c = strdup(path);
        if (!c || !push_candidate(cands, c, cfg->plugin_path_lines[i], err))
            return BERTH_E_NOMEM;
    }
    /* The same file named twice (by a folder and a path=, or through a link) is loaded once. */
    char **real = calloc((size_t)cands->n + 1, sizeof *real);
    if (!real)
        return BERTH_E_NOMEM;
    int kept = 0;
    for (int i = 0; i < cands->n; i++) {
        struct candidate c = cands->v[i];
        char *r = c.err ? NULL : realpath(c.path, NULL);
        int dup = 0;
        for (int j = 0; r && j < kept; j++)
            if (real[j] && strcmp(real[j], r) == 0)
                dup = 1;
        if (dup) {
            host_log(BERTH_LOG_DEBUG, "%s: listed twice, loaded once", c.path);
            free(c.path);
            free(r);
            continue;
        }
        real[kept] = r;
        cands->v[kept++] = c;
    }
    for (int j = 0; j < kept; j++)
        free(real[j]);
    free(real);
    cands->n = kept;
    return BERTH_OK;
}

berth_status registry_load(const struct berth_config *cfg, struct registry **out)
{
    *out = NULL;
    struct registry *reg = calloc(1, sizeof *reg);
    if (!reg)
        return berth_fail(BERTH_E_NOMEM, "out of memory");
    reg->cfg = cfg;
    struct cand_list cands = {0};
    berth_status st = discover(reg, &cands);
    if (st == BERTH_OK && cands.n > 0) {
        reg->plugins = calloc((size_t)cands.n, sizeof *reg->plugins);
        if (!reg->plugins)
            st = BERTH_E_NOMEM;
    }
    if (st != BERTH_OK) {
        for (int i = 0; i < cands.n; i++)
            free(cands.v[i].path);
        free(cands.v);
        registry_free(reg);
        return berth_fail(st, "out of memory");
    }
    /* Sized once, before any host table points into it. */
    for (int i = 0; i < cands.n; i++) {
        struct plugin *p = &reg->plugins[i];
        p->path = cands.v[i].path;
        p->line = cands.v[i].line;
        reg->n_plugins++;
        if (cands.v[i].err)
            set_reason(p, PLUGIN_MISSING, "%s:%d: [plugins] path: %s", cfg->path, p->line, strerror(cands.v[i].err));
        else
            load_one(reg, i);
        host_log(BERTH_LOG_INFO, "%s: %s%s%s", p->path,
                 p->state == PLUGIN_LOADED ? "loaded" : p->state == PLUGIN_MISSING ? "missing" : "rejected",
                 p->reason[0] ? ": " : "", p->reason);
    }
    free(cands.v);
    berth_clear_error();
    *out = reg;
    return BERTH_OK;
}

void registry_free(struct registry *reg)
{
    if (!reg)
        return;
    for (int i = 0; i < reg->n_plugins; i++) {
        free(reg->plugins[i].path);
        free(reg->plugins[i].devices);
    }
    free(reg->plugins);
    for (int i = 0; i < reg->n_warnings; i++)
        free(reg->warnings[i]);
    free(reg->warnings);
    free(reg->dir_n_files);
    free(reg);
}

struct plugin *registry_find(struct registry *reg, int kind, const char *name)
{
    return (struct plugin *)find_loaded(reg, reg->n_plugins, kind, name);
}

int plugin_enabled(const struct plugin *p) { return p->cfg ? p->cfg->enabled : 1; }
int plugin_priority(const struct plugin *p) { return p->cfg ? p->cfg->priority : 0; }
int plugin_device(const struct plugin *p) { return p->cfg ? p->cfg->device : 0; }

/* ------------------------------------------------------------------------------------------------------------ */
/* Selection */

static void why_add(struct selection *sel, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void why_add(struct selection *sel, const char *fmt, ...)
{
    size_t n = strlen(sel->why);
    if (n + 1 >= sizeof sel->why)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sel->why + n, sizeof sel->why - n, fmt, ap);
    va_end(ap);
}

/* "a, b, c" of the loaded plugins of a kind, or "none". */
static void loaded_names(const struct registry *reg, int kind, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < reg->n_plugins; i++) {
        const struct plugin *p = &reg->plugins[i];
        if (p->state != PLUGIN_LOADED || p->kind != kind)
            continue;
        int w = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", p->desc->name);
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
    if (!n)
        snprintf(buf, cap, "none");
}

static int cmp_model_name(const void *a, const void *b)
{
    const struct plugin *const *x = a, *const *y = b;
    return strcmp((*x)->desc->name, (*y)->desc->name);
}

static int cmp_backend_rank(const void *a, const void *b)
{
    const struct plugin *const *x = a, *const *y = b;
    int px = plugin_priority(*x), py = plugin_priority(*y);
    if (px != py)
        return px > py ? -1 : 1;
    return strcmp((*x)->desc->name, (*y)->desc->name);
}

/* Loaded plugins of one kind, sorted. Caller frees. */
static struct plugin **collect(struct registry *reg, int kind, int (*cmp)(const void *, const void *), int *n)
{
    *n = 0;
    struct plugin **v = calloc((size_t)reg->n_plugins + 1, sizeof *v);
    if (!v)
        return NULL;
    for (int i = 0; i < reg->n_plugins; i++)
        if (reg->plugins[i].state == PLUGIN_LOADED && reg->plugins[i].kind == kind)
            v[(*n)++] = &reg->plugins[i];
    qsort(v, (size_t)*n, sizeof *v, cmp);
    return v;
}

/* "model_type 'x'" for the why text, and "DIR (model_type 'x')" for errors, which must say which checkpoint. */
static void describe_ckpt(const berth_checkpoint *ck, char *type, size_t tcap, char *full, size_t fcap)
{
    const char *mt = ck ? ckpt_model_type(ck) : NULL;
    if (mt)
        snprintf(type, tcap, "model_type '%s'", mt);
    else
        snprintf(type, tcap, "no model_type");
    berth_host_ctx hc = {.plugin_name = "berth"};
    const char *dir = ck ? ckpt_svc_dir(&hc, ck) : NULL;
    snprintf(full, fcap, "%s (%s)", dir ? dir : "the checkpoint", type);
}

/* Pick the model plugin (forced by [model] plugin, else the first in name order that accepts). */
static berth_status select_model(struct registry *reg, const berth_checkpoint *ck, struct selection *sel)
{
    const struct berth_config *cfg = reg->cfg;
    char ckdesc[160], ckfull[1200], names[512];
    describe_ckpt(ck, ckdesc, sizeof ckdesc, ckfull, sizeof ckfull);
    if (cfg->model_plugin) {
        struct plugin *p = registry_find(reg, BERTH_PLUGIN_MODEL, cfg->model_plugin);
        if (!p) {
            loaded_names(reg, BERTH_PLUGIN_MODEL, names, sizeof names);
            return berth_fail(BERTH_E_NOT_FOUND,
                              "%s:%d: [model] plugin: no model plugin named '%s' is loaded (loaded model plugins: %s)",
                              cfg->path, cfg->model_plugin_line, cfg->model_plugin, names);
        }
        const berth_model_vtable *vt = p->desc->vtable;
        berth_clear_error();
        char msg[512];
        if (vt->accept(&p->host, ck) != BERTH_OK)
            return berth_fail(BERTH_E_UNSUPPORTED, "%s:%d: [model] plugin: model plugin '%s' does not accept %s: %s",
                              cfg->path, cfg->model_plugin_line, p->desc->name, ckfull,
                              saved_plugin_msg(msg, sizeof msg));
        sel->model_plugin = p;
        why_add(sel, "model plugin: %s %s (accepts %s; forced by [model] plugin)\n", p->desc->name,
                p->desc->version, ckdesc);
        return BERTH_OK;
    }

    int n;
    struct plugin **models = collect(reg, BERTH_PLUGIN_MODEL, cmp_model_name, &n);
    if (!models)
        return berth_fail(BERTH_E_NOMEM, "out of memory");
    if (n == 0) {
        free(models);
        return berth_fail(BERTH_E_NOT_FOUND, "no model plugin is loaded (see `berth plugins --config %s`)",
                          cfg->path);
    }
    char declined[2048] = "";
    size_t dn = 0;
    for (int i = 0; i < n; i++) {
        struct plugin *p = models[i];
        const berth_model_vtable *vt = p->desc->vtable;
        berth_clear_error();
        if (vt->accept(&p->host, ck) == BERTH_OK) {
            sel->model_plugin = p;
            break;
        }
        int w = snprintf(declined + dn, sizeof declined - dn, "%s%s: declined: %s", dn ? "; " : "", p->desc->name,
                         plugin_msg());
        if (w > 0)
            dn = dn + (size_t)w < sizeof declined ? dn + (size_t)w : sizeof declined - 1;
    }
    free(models);
    if (!sel->model_plugin)
        return berth_fail(BERTH_E_UNSUPPORTED, "no model plugin accepts %s: %s", ckfull, declined);
    why_add(sel, "model plugin: %s %s (accepts %s)\n", sel->model_plugin->desc->name,
            sel->model_plugin->desc->version, ckdesc);
    /* The decliners, one per line, in the order they were asked. */
    for (char *s = declined; *s;) {
        char *e = strstr(s, "; ");
        size_t len = e ? (size_t)(e - s) : strlen(s);
        why_add(sel, "  %.*s\n", (int)len, s);
        s += len + (e ? 2 : 0);
    }
    return BERTH_OK;
}

/* Check every requirement against an initialised backend. Returns 1 if all pass, else writes a reason. */
static int covers(struct plugin *bp, berth_backend *be, const berth_ops *ops, const struct plugin *mp,
                  const berth_requirement *const *reqs, int32_t n_req, char *reason, size_t cap)
{
    const berth_backend_vtable *vt = bp->desc->vtable;
    for (int32_t i = 0; i < n_req; i++) {
        const berth_requirement *r = reqs[i];
        /* Checked here, not trusted: a malformed list from the model must not crash the host. */
        if (!r || r->struct_size < BERTH_SIZE_TO(berth_requirement, params)) {
            snprintf(reason, cap, "%s: cannot check requirement %d of %s: it is %s", bp->desc->name, (int)i,
                     mp->desc->name, r ? "too small (struct_size)" : "NULL");
            return 0;
        }
        char opname[32];
        if (r->op >= 0 && r->op < BERTH_OP_COUNT)
            snprintf(opname, sizeof opname, "%s", op_names[r->op]);
        else
            snprintf(opname, sizeof opname, "op %d", (int)r->op);
        const char *what = BERTH_HAS(r, berth_requirement, what) && r->what && r->what[0] ? r->what : opname;
        /* Op members follow struct_size in BERTH_OP_* order (append-only), so newer ops are found the same way. */
        size_t off = offsetof(berth_ops, matmul) + (size_t)(r->op < 0 ? 0 : r->op) * sizeof(any_fn);
        if (r->op < 0 || ops->struct_size < off + sizeof(any_fn) || !member_at(ops, off)) {
            snprintf(reason, cap, "%s: lacks op %s required by %s: no '%s' in its op table", bp->desc->name, what,
                     mp->desc->name, opname);
            return 0;
        }
        berth_clear_error();
        if (vt->supports(be, r->op, r->params) != BERTH_OK) {
            snprintf(reason, cap, "%s: lacks op %s required by %s: %s", bp->desc->name, what, mp->desc->name,
                     plugin_msg());
            return 0;
        }
    }
    return 1;
}

/* Try one backend: init its device, check the model's requirements. On success the backend stays initialised. */
static int try_backend(struct plugin *bp, const struct plugin *mp, const berth_requirement *const *reqs,
                       int32_t n_req, struct selection *sel, char *reason, size_t cap)
{
    const berth_backend_vtable *vt = bp->desc->vtable;
    int dev = plugin_device(bp);
    berth_backend *be = NULL;
    berth_clear_error();
    if (vt->init(&bp->host, dev, &be) != BERTH_OK || !be) {
        snprintf(reason, cap, "%s: init of device %d failed: %s", bp->desc->name, dev, plugin_msg());
        return 0;
    }
    const berth_ops *ops = vt->get_ops(be);
    if (!ops) {
        snprintf(reason, cap, "%s: get_ops returned NULL", bp->desc->name);
        vt->destroy(be);
        return 0;
    }
    if (!covers(bp, be, ops, mp, reqs, n_req, reason, cap)) {
        vt->destroy(be);
        return 0;
    }
    sel->backend_plugin = bp;
    sel->device = dev;
    sel->backend = be;
    sel->api.struct_size = (uint32_t)sizeof sel->api;
    sel->api.device_index = dev;
    sel->api.vt = vt;
    sel->api.ops = ops;
    sel->api.be = be;
    sel->api.device = &bp->devices[dev];
    return 1;
}

berth_status registry_select(struct registry *reg, const berth_checkpoint *ck, struct selection *out)
{
    memset(out, 0, sizeof *out);
    const struct berth_config *cfg = reg->cfg;

    /* A forced backend must exist before anything else is tried. */
    const char *env = getenv("BERTH_BACKEND");
    const char *forced = env && env[0] ? env : cfg->model_backend;
    char forced_by[160] = "";
    if (env && env[0])
        snprintf(forced_by, sizeof forced_by, "BERTH_BACKEND=%s", env);
    else if (forced)
        snprintf(forced_by, sizeof forced_by, "[model] backend = %s", forced);
    if (forced && !registry_find(reg, BERTH_PLUGIN_BACKEND, forced)) {
        char names[512];
        loaded_names(reg, BERTH_PLUGIN_BACKEND, names, sizeof names);
        if (env && env[0])
            return berth_fail(BERTH_E_NOT_FOUND, "BERTH_BACKEND=%s: no backend plugin named '%s' is loaded (loaded "
                              "backends: %s)", forced, forced, names);
        return berth_fail(BERTH_E_NOT_FOUND, "%s:%d: [model] backend: no backend plugin named '%s' is loaded "
                          "(loaded backends: %s)", cfg->path, cfg->model_backend_line, forced, names);
    }

    berth_status st = select_model(reg, ck, out);
    if (st != BERTH_OK)
        return st;
    struct plugin *mp = out->model_plugin;
    const berth_model_vtable *mvt = mp->desc->vtable;
    char msg[512];
    berth_clear_error();
    if (mvt->create(&mp->host, ck, &out->model) != BERTH_OK || !out->model) {
        out->model = NULL;
        return berth_fail(BERTH_E_UNSUPPORTED, "model plugin '%s': create failed: %s", mp->desc->name,
                          saved_plugin_msg(msg, sizeof msg));
    }
    const berth_requirement *const *reqs = NULL;
    int32_t n_req = 0;
    berth_clear_error();
    if (mvt->requirements(out->model, &reqs, &n_req) != BERTH_OK || n_req < 0 || (n_req > 0 && !reqs)) {
        st = berth_fail(BERTH_E_UNSUPPORTED, "model plugin '%s': requirements failed: %s", mp->desc->name,
                        saved_plugin_msg(msg, sizeof msg));
        mvt->destroy(out->model);
        out->model = NULL;
        return st;
    }

    int nb;
    struct plugin **bes = collect(reg, BERTH_PLUGIN_BACKEND, cmp_backend_rank, &nb);
    if (!bes) {
        mvt->destroy(out->model);
        out->model = NULL;
        return berth_fail(BERTH_E_NOMEM, "out of memory");
    }
    /* Reasons in rank order; the chosen one's line goes first, so collect the others separately. */
    char others[3072] = "", all[1024] = "", fallback[1024] = "";
    size_t on = 0, an = 0, fn = 0;
    for (int i = 0; i < nb; i++) {
        struct plugin *bp = bes[i];
        const char *name = bp->desc->name;
        char reason[700];
        int tried_and_failed = 0;
        if (forced && strcmp(name, forced) != 0) {
            snprintf(reason, sizeof reason, "%s: not selected: %s", name, forced_by);
        } else if (!forced && !plugin_enabled(bp)) {
            snprintf(reason, sizeof reason, "%s: disabled in config", name);
        } else if (bp->probe.n_devices == 0) {
            snprintf(reason, sizeof reason, "%s: no devices: %s", name,
                     bp->probe.message[0] ? bp->probe.message : "(the plugin gave no reason)");
            tried_and_failed = 1;
        } else if (plugin_device(bp) >= bp->probe.n_devices) {
            snprintf(reason, sizeof reason, "%s: device %d not present (%d device%s)", name, plugin_device(bp),
                     bp->probe.n_devices, bp->probe.n_devices == 1 ? "" : "s");
            tried_and_failed = 1;
        } else if (out->backend_plugin) {
            snprintf(reason, sizeof reason, "%s: not tried: %s (priority %d) comes first (priority %d)", name,
                     out->backend_plugin->desc->name, plugin_priority(out->backend_plugin), plugin_priority(bp));
        } else if (try_backend(bp, mp, reqs, n_req, out, reason, sizeof reason)) {
            continue;
        } else {
            tried_and_failed = 1;
        }
        int w = snprintf(others + on, sizeof others - on, "  %s\n", reason);
        if (w > 0)
            on = on + (size_t)w < sizeof others ? on + (size_t)w : sizeof others - 1;
        if (!forced || strcmp(name, forced) == 0) { /* when forced, the others do not explain the failure */
            w = snprintf(all + an, sizeof all - an, "%s%s", an ? "; " : "", reason);
            if (w > 0)
                an = an + (size_t)w < sizeof all ? an + (size_t)w : sizeof all - 1;
        }
        if (tried_and_failed && !out->backend_plugin) {
            w = snprintf(fallback + fn, sizeof fallback - fn, "%s%s", fn ? "; " : "", reason);
            if (w > 0)
                fn = fn + (size_t)w < sizeof fallback ? fn + (size_t)w : sizeof fallback - 1;
        }
    }
    free(bes);

    if (!out->backend_plugin) {
        why_add(out, "backend: none usable\n%s", others);
        if (forced)
            st = berth_fail(BERTH_E_UNSUPPORTED, "no usable backend for %s (%s): %s", mp->desc->name, forced_by, all);
        else
            st = berth_fail(BERTH_E_UNSUPPORTED, "no usable backend for %s: %s", mp->desc->name,
                            nb ? all : "no backend plugin is loaded");
        mvt->destroy(out->model);
        out->model = NULL;
        return st;
    }
    struct plugin *bp = out->backend_plugin;
    why_add(out, "backend: %s %s, device %d (%s), priority %d%s%s\n", bp->desc->name, bp->desc->version, out->device,
            bp->devices[out->device].name, plugin_priority(bp), forced ? ", forced by " : "", forced ? forced_by : "");
    why_add(out, "%s", others);
    if (fn)
        host_log(BERTH_LOG_WARN, "using backend '%s' for %s: %s", bp->desc->name, mp->desc->name, fallback);
    berth_clear_error();
    return BERTH_OK;
}

void selection_destroy_model(struct selection *sel)
{
    if (!sel)
        return;
    if (sel->model && sel->model_plugin) {
        const berth_model_vtable *mvt = sel->model_plugin->desc->vtable;
        mvt->destroy(sel->model);
    }
    sel->model = NULL;
}

void selection_release(struct selection *sel)
{
    if (!sel)
        return;
    selection_destroy_model(sel);
    if (sel->backend && sel->backend_plugin) {
        const berth_backend_vtable *bvt = sel->backend_plugin->desc->vtable;
        bvt->destroy(sel->backend);
    }
    sel->model = NULL;
    sel->backend = NULL;
}

/*
 * config.c — parse the berth INI config (see config.h, docs/config.md).
 *
 * inih does the tokenising; we feed it through ini_parse_stream with our own line reader so that every key we are
 * handed has an exact line number (for "file:line:" messages), so that an indented line is never glued to the
 * previous value as a continuation, and so that section headers without keys are still seen. Each key is checked
 * as soon as it is read; the first fatal problem (by line) wins, warnings are collected and logged.
 */
#include "config.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

#include "errors.h"
#include "host_services.h"

#ifndef BERTH_DEFAULT_PLUGIN_DIR
#define BERTH_DEFAULT_PLUGIN_DIR "/usr/local/lib/berth/plugins"
#endif

/* inih copies section names into a 50-byte buffer; longer ones would be silently cut. */
#define CFG_MAX_SECTION 49

enum sec_kind { SEC_UNKNOWN, SEC_PLUGINS, SEC_BACKEND, SEC_MODEL, SEC_MODEL_PLUGIN, SEC_KV, SEC_SCHEDULER, SEC_SERVER };

struct parse_state {
    struct berth_config *cfg;
    FILE *f;
    int line;           /* physical line last handed to inih */
    char *linebuf;      /* getline buffer */
    size_t linecap;
    int read_errno;     /* non-zero when reading failed */
    char *first_char;   /* first non-blank character of each line (index line-1), for syntax messages */
    int first_char_cap;
    int cur_sec;        /* index into cfg->sections of the section being read, -1 before the first header */
    int saw_plugins;    /* a [plugins] header was seen */
    int *warning_lines; /* line of each cfg->warnings entry */
    berth_status err;   /* first fatal problem */
    int err_line;
    char errmsg[1024];
};

/* ------------------------------------------------------------------------------------------------------------ */
/* Messages */

static void fail_at(struct parse_state *ps, berth_status code, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_at(struct parse_state *ps, berth_status code, int line, const char *fmt, ...)
{
    if (ps->err != BERTH_OK && ps->err_line <= line)
        return; /* keep the first problem in file order */
    int n = snprintf(ps->errmsg, sizeof ps->errmsg, "%s:%d: ", ps->cfg->path, line);
    if (n < 0 || (size_t)n >= sizeof ps->errmsg)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->errmsg + n, sizeof ps->errmsg - (size_t)n, fmt, ap);
    va_end(ap);
    ps->err = code;
    ps->err_line = line;
}

static void nomem(struct parse_state *ps)
{
    fail_at(ps, BERTH_E_NOMEM, ps->line, "out of memory");
}

static void warn_at(struct parse_state *ps, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void warn_at(struct parse_state *ps, int line, const char *fmt, ...)
{
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "%s:%d: ", ps->cfg->path, line);
    if (n < 0 || (size_t)n >= sizeof msg)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);

    /* Logged when parsing ends (see log_warnings), so a fatal error can suppress the ones it caused. */
    struct berth_config *cfg = ps->cfg;
    char *copy = strdup(msg);
    char **w = copy ? realloc(cfg->warnings, sizeof *w * (size_t)(cfg->n_warnings + 1)) : NULL;
    if (w)
        cfg->warnings = w;
    int *wl = w ? realloc(ps->warning_lines, sizeof *wl * (size_t)(cfg->n_warnings + 1)) : NULL;
    if (!wl) {
        free(copy);
        nomem(ps);
        return;
    }
    ps->warning_lines = wl;
    ps->warning_lines[cfg->n_warnings] = line;
    cfg->warnings[cfg->n_warnings++] = copy;
}

/* Log the warnings of lines before `upto` (all of them when upto is INT_MAX). */
static void log_warnings(const struct parse_state *ps, int upto)
{
    for (int i = 0; i < ps->cfg->n_warnings; i++)
        if (ps->warning_lines[i] < upto)
            host_log(BERTH_LOG_WARN, "%s", ps->cfg->warnings[i]);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Value parsers. Each returns 1 on success. */

static int parse_bool(const char *v, int *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"};
    static const char *const no[] = {"false", "no", "off", "0"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = 1;
            return 1;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = 0;
            return 1;
        }
    }
    return 0;
}

/* Decimal integer (optional sign), whole string. */
static int parse_long(const char *v, long long *out)
{
    if (!*v)
        return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v)
        return 0;
    *out = x;
    return 1;
}

/* "512", "512K", "512MiB", "2G", ...: binary multiples; no fractions. */
static int parse_size(const char *v, uint64_t *out)
{
    static const struct {
        const char *suffix;
        unsigned shift;
    } units[] = {{"", 0}, {"B", 0}, {"K", 10}, {"KiB", 10}, {"M", 20}, {"MiB", 20},
                 {"G", 30}, {"GiB", 30}, {"T", 40}, {"TiB", 40}};
    const char *p = v;
    if (*p < '0' || *p > '9')
        return 0;
    uint64_t x = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (x > (UINT64_MAX - 9) / 10)
            return 0;
        x = x * 10 + (uint64_t)(*p - '0');
    }
    while (*p == ' ')
        p++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(p, units[i].suffix) == 0) {
            if (units[i].shift && x > (UINT64_MAX >> units[i].shift))
                return 0;
            *out = x << units[i].shift;
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Building the config */

static enum sec_kind section_kind(const char *name)
{
    if (strcmp(name, "plugins") == 0)
        return SEC_PLUGINS;
    if (strncmp(name, "backend.", 8) == 0 && name[8])
        return SEC_BACKEND;
    if (strcmp(name, "model") == 0)
        return SEC_MODEL;
    if (strncmp(name, "model.", 6) == 0 && name[6])
        return SEC_MODEL_PLUGIN;
    if (strcmp(name, "kv") == 0)
        return SEC_KV;
    if (strcmp(name, "scheduler") == 0)
        return SEC_SCHEDULER;
    if (strcmp(name, "server") == 0)
        return SEC_SERVER;
    return SEC_UNKNOWN;
}

static int find_section(const struct berth_config *cfg, const char *name)
{
    for (int i = 0; i < cfg->n_sections; i++)
        if (strcmp(cfg->sections[i].name, name) == 0)
            return i;
    return -1;
}

static struct cfg_backend *find_backend(struct berth_config *cfg, const char *name)
{
    for (int i = 0; i < cfg->n_backends; i++)
        if (strcmp(cfg->backends[i].name, name) == 0)
            return &cfg->backends[i];
    return NULL;
}

/* A "[name]" header at line ps->line. Repeated headers continue the same section. */
static void open_section(struct parse_state *ps, const char *name)
{
    struct berth_config *cfg = ps->cfg;
    if (strlen(name) > CFG_MAX_SECTION) {
        fail_at(ps, BERTH_E_INVALID, ps->line, "section name [%.20s...] is longer than %d characters", name,
                CFG_MAX_SECTION);
        ps->cur_sec = -1;
        return;
    }
    int idx = find_section(cfg, name);
    if (idx >= 0) {
        warn_at(ps, ps->line, "section [%s] repeated (first at line %d); its keys are merged", name,
                cfg->sections[idx].line);
        ps->cur_sec = idx;
        return;
    }
    struct cfg_section *s = realloc(cfg->sections, sizeof *s * (size_t)(cfg->n_sections + 1));
    if (!s) {
        nomem(ps);
        return;
    }
    cfg->sections = s;
    struct cfg_section *sec = &cfg->sections[cfg->n_sections];
    memset(sec, 0, sizeof *sec);
    sec->name = strdup(name);
    if (!sec->name) {
        nomem(ps);
        return;
    }
    sec->line = ps->line;
    ps->cur_sec = cfg->n_sections++;

    switch (section_kind(name)) {
    case SEC_UNKNOWN:
        warn_at(ps, ps->line, "unknown section [%s] (ignored)", name);
        break;
    case SEC_PLUGINS:
        ps->saw_plugins = 1;
        break;
    case SEC_BACKEND: {
        struct cfg_backend *b = realloc(cfg->backends, sizeof *b * (size_t)(cfg->n_backends + 1));
        if (!b) {
            nomem(ps);
            return;
        }
        cfg->backends = b;
        struct cfg_backend *be = &cfg->backends[cfg->n_backends];
        memset(be, 0, sizeof *be);
        be->name = strdup(name + 8);
        if (!be->name) {
            nomem(ps);
            return;
        }
        be->enabled = 1;
        be->line = ps->line;
        cfg->n_backends++;
        break;
    }
    default:
        break;
    }
}

static int append_str(char ***list, int **lines, int *n, char *s, int line)
{
    char **l = realloc(*list, sizeof *l * (size_t)(*n + 1));
    if (!l)
        return 0;
    *list = l;
    int *ln = realloc(*lines, sizeof *ln * (size_t)(*n + 1));
    if (!ln)
        return 0;
    *lines = ln;
    (*list)[*n] = s;
    (*lines)[*n] = line;
    (*n)++;
    return 1;
}

/* Integer key with bounds [lo, hi]. Messages name the range. */
static void take_int(struct parse_state *ps, const char *sec, const char *key, const char *v, long long lo,
                     long long hi, int *out)
{
    long long x;
    if (!parse_long(v, &x)) {
        fail_at(ps, BERTH_E_INVALID, ps->line, "[%s] %s: invalid integer '%s'", sec, key, v);
        return;
    }
    if (x < lo || x > hi) {
        if (hi == INT32_MAX && lo != INT32_MIN)
            fail_at(ps, BERTH_E_INVALID, ps->line, "[%s] %s: must be >= %lld, got '%s'", sec, key, lo, v);
        else
            fail_at(ps, BERTH_E_INVALID, ps->line, "[%s] %s: must be %lld..%lld, got '%s'", sec, key, lo, hi, v);
        return;
    }
    *out = (int)x;
}

static void take_bool(struct parse_state *ps, const char *sec, const char *key, const char *v, int *out)
{
    if (!parse_bool(v, out))
        fail_at(ps, BERTH_E_INVALID, ps->line,
                "[%s] %s: invalid boolean '%s' (use true/false, yes/no, on/off or 1/0)", sec, key, v);
}

/* Non-empty string value; path values are resolved against the config folder. */
static char *take_value(struct parse_state *ps, const char *sec, const char *key, const char *v, int is_path)
{
    if (!*v) {
        fail_at(ps, BERTH_E_INVALID, ps->line, "[%s] %s: empty value", sec, key);
        return NULL;
    }
    char *r = is_path ? config_resolve_path(ps->cfg, v) : strdup(v);
    if (!r)
        nomem(ps);
    return r;
}

static void unknown_key(struct parse_state *ps, const char *sec, const char *key)
{
    warn_at(ps, ps->line, "unknown key '%s' in [%s] (ignored)", key, sec);
}

/* Check and store one known key. The raw entry is already recorded in its section. */
static void interpret(struct parse_state *ps, const struct cfg_section *sec, const char *key, const char *v)
{
    struct berth_config *cfg = ps->cfg;
    const char *sn = sec->name;
    switch (section_kind(sn)) {
    case SEC_PLUGINS:
        if (strcmp(key, "dir") == 0 || strcmp(key, "path") == 0) {
            char *p = take_value(ps, sn, key, v, 1);
            if (!p)
                return;
            int ok = key[0] == 'd'
                         ? append_str(&cfg->plugin_dirs, &cfg->plugin_dir_lines, &cfg->n_plugin_dirs, p, ps->line)
                         : append_str(&cfg->plugin_paths, &cfg->plugin_path_lines, &cfg->n_plugin_paths, p,
                                      ps->line);
            if (!ok) {
                free(p);
                nomem(ps);
            }
        } else {
            unknown_key(ps, sn, key);
        }
        return;
    case SEC_BACKEND: {
        /* Other keys belong to the plugin (config_get); the host cannot judge them. */
        struct cfg_backend *be = find_backend(cfg, sn + 8);
        if (!be)
            return;
        if (strcmp(key, "enabled") == 0)
            take_bool(ps, sn, key, v, &be->enabled);
        else if (strcmp(key, "priority") == 0)
            take_int(ps, sn, key, v, INT32_MIN, INT32_MAX, &be->priority);
        else if (strcmp(key, "device") == 0)
            take_int(ps, sn, key, v, 0, INT32_MAX, &be->device);
        return;
    }
    case SEC_MODEL: {
        char *s;
        if (strcmp(key, "path") == 0) {
            if ((s = take_value(ps, sn, key, v, 1))) {
                free(cfg->model_path);
                cfg->model_path = s;
            }
        } else if (strcmp(key, "plugin") == 0) {
            if ((s = take_value(ps, sn, key, v, 0))) {
                free(cfg->model_plugin);
                cfg->model_plugin = s;
                cfg->model_plugin_line = ps->line;
            }
        } else if (strcmp(key, "backend") == 0) {
            if ((s = take_value(ps, sn, key, v, 0))) {
                free(cfg->model_backend);
                cfg->model_backend = s;
                cfg->model_backend_line = ps->line;
            }
        } else {
            unknown_key(ps, sn, key);
        }
        return;
    }
    case SEC_KV:
        if (strcmp(key, "block_size") == 0) {
            take_int(ps, sn, key, v, 1, INT32_MAX, &cfg->kv_block_size);
        } else if (strcmp(key, "dtype") == 0) {
            if (strcmp(v, "auto") == 0)
                cfg->kv_dtype = -1;
            else if (strcmp(v, "f32") == 0)
                cfg->kv_dtype = BERTH_DTYPE_F32;
            else if (strcmp(v, "bf16") == 0)
                cfg->kv_dtype = BERTH_DTYPE_BF16;
            else if (strcmp(v, "f16") == 0)
                cfg->kv_dtype = BERTH_DTYPE_F16;
            else
                fail_at(ps, BERTH_E_INVALID, ps->line, "[%s] %s: '%s' is not one of auto, f32, bf16, f16", sn, key, v);
        } else if (strcmp(key, "memory") == 0) {
            if (!parse_size(v, &cfg->kv_memory_bytes))
                fail_at(ps, BERTH_E_INVALID, ps->line,
                        "[%s] %s: invalid size '%s' (use a number with an optional K, M, G, T, KiB, MiB, GiB or "
                        "TiB suffix)",
                        sn, key, v);
        } else {
            unknown_key(ps, sn, key);
        }
        return;
    case SEC_SCHEDULER:
        if (strcmp(key, "max_batch_tokens") == 0)
            take_int(ps, sn, key, v, 1, INT32_MAX, &cfg->sched_max_batch_tokens);
        else if (strcmp(key, "max_seqs") == 0)
            take_int(ps, sn, key, v, 1, INT32_MAX, &cfg->sched_max_seqs);
        else if (strcmp(key, "graphs") == 0)
            take_bool(ps, sn, key, v, &cfg->sched_graphs);
        else if (strcmp(key, "overlap") == 0) {
            int b;
            if (strcmp(v, "auto") == 0)
                cfg->sched_overlap = 0;
            else if (parse_bool(v, &b))
                cfg->sched_overlap = b ? 1 : -1;
            else
                fail_at(ps, BERTH_E_INVALID, ps->line,
                        "[%s] %s: '%s' is not auto or a boolean (true/false, yes/no, on/off, 1/0)", sn, key, v);
        } else
            unknown_key(ps, sn, key);
        return;
    case SEC_SERVER:
        if (strcmp(key, "host") == 0) {
            char *s = take_value(ps, sn, key, v, 0);
            if (s) {
                free(cfg->server_host);
                cfg->server_host = s;
            }
        } else if (strcmp(key, "port") == 0) {
            take_int(ps, sn, key, v, 1, 65535, &cfg->server_port);
        } else {
            unknown_key(ps, sn, key);
        }
        return;
    case SEC_MODEL_PLUGIN: /* all keys belong to the model plugin */
    case SEC_UNKNOWN:      /* already warned about at the header */
        return;
    }
}

static int is_repeatable(const char *sec, const char *key)
{
    return strcmp(sec, "plugins") == 0 && (strcmp(key, "dir") == 0 || strcmp(key, "path") == 0);
}

static int on_key(void *user, const char *section, const char *name, const char *value)
{
    (void)section; /* our reader tracks sections itself (inih would truncate long names) */
    struct parse_state *ps = user;
    if (!name[0]) {
        fail_at(ps, BERTH_E_INVALID, ps->line, "syntax error: no key before '='");
        return 1;
    }
    if (ps->cur_sec < 0) {
        warn_at(ps, ps->line, "key '%s' outside any section (ignored)", name);
        return 1;
    }
    struct cfg_section *sec = &ps->cfg->sections[ps->cur_sec];
    if (!is_repeatable(sec->name, name)) {
        for (int i = 0; i < sec->n_entries; i++) {
            if (strcmp(sec->entries[i].key, name) == 0) {
                warn_at(ps, ps->line, "[%s] %s: duplicate key (first at line %d); the last value wins", sec->name,
                        name, sec->entries[i].line);
                break;
            }
        }
    }
    struct cfg_entry *e = realloc(sec->entries, sizeof *e * (size_t)(sec->n_entries + 1));
    if (!e) {
        nomem(ps);
        return 1;
    }
    sec->entries = e;
    e = &sec->entries[sec->n_entries];
    e->key = strdup(name);
    e->value = strdup(value);
    e->line = ps->line;
    if (!e->key || !e->value) {
        free(e->key);
        free(e->value);
        nomem(ps);
        return 1;
    }
    sec->n_entries++;
    interpret(ps, sec, name, value);
    return 1; /* our own problems are recorded in ps; a 0 here would look like a syntax error */
}

/* The ini_reader: one physical line per call, leading blanks removed. */
static char *read_line(char *str, int num, void *stream)
{
    struct parse_state *ps = stream;
    errno = 0;
    ssize_t n = getline(&ps->linebuf, &ps->linecap, ps->f);
    if (n < 0) {
        if (ferror(ps->f))
            ps->read_errno = errno ? errno : EIO;
        return NULL;
    }
    ps->line++;
    char *s = ps->linebuf;
    if (ps->line == 1 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB && (unsigned char)s[2] == 0xBF)
        s += 3; /* UTF-8 byte order mark */
    while (*s == ' ' || *s == '\t')
        s++;
    size_t content = strlen(s);
    if (s + content < ps->linebuf + n) /* getline read past a NUL byte that strlen stops at */
        fail_at(ps, BERTH_E_INVALID, ps->line, "line contains a NUL byte");
    while (content && (s[content - 1] == '\n' || s[content - 1] == '\r'))
        content--;

    if (ps->line > ps->first_char_cap) {
        int cap = ps->first_char_cap ? ps->first_char_cap * 2 : 64;
        char *fc = realloc(ps->first_char, (size_t)cap);
        if (!fc) {
            nomem(ps);
            return NULL;
        }
        ps->first_char = fc;
        ps->first_char_cap = cap;
    }
    ps->first_char[ps->line - 1] = *s;

    if (num < 3)
        return NULL;
    if (content > (size_t)num - 2) {
        fail_at(ps, BERTH_E_INVALID, ps->line, "line is longer than %d characters", num - 2);
        content = (size_t)num - 2;
    }
    /* inih gets the content and one '\n' whatever the line ended with: the copy is bounded by the content, never
     * by the raw length (a short line followed by hundreds of '\r' overflowed inih's stack buffer here — found by
     * tests/fuzz/fuzz_config_load). */
    memcpy(str, s, content);
    str[content] = '\n';
    str[content + 1] = '\0';

    /* Section headers: inih only reports sections through their keys; we want empty ones and exact lines. The
     * name ends at the first ']' (an inline " ;" comment before it makes inih report a syntax error). */
    if (*s == '[') {
        const char *end = s + 1;
        while (*end && *end != ']' && !(*end == ';' && (end[-1] == ' ' || end[-1] == '\t')))
            end++;
        if (*end == ']') {
            char name[256];
            size_t nl = (size_t)(end - s - 1);
            if (nl >= sizeof name)
                nl = sizeof name - 1;
            memcpy(name, s + 1, nl);
            name[nl] = '\0';
            open_section(ps, name);
        }
    }
    return str;
}

/* ------------------------------------------------------------------------------------------------------------ */

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

char *config_resolve_path(const struct berth_config *cfg, const char *p)
{
    if (p[0] == '/' || !cfg->dir)
        return strdup(p);
    size_t dl = strlen(cfg->dir), pl = strlen(p);
    int need_slash = dl && cfg->dir[dl - 1] != '/';
    char *r = malloc(dl + (size_t)need_slash + pl + 1);
    if (!r)
        return NULL;
    memcpy(r, cfg->dir, dl);
    if (need_slash)
        r[dl] = '/';
    memcpy(r + dl + need_slash, p, pl + 1);
    return r;
}

static void apply_defaults(struct berth_config *cfg)
{
    cfg->kv_block_size = 16;
    cfg->kv_memory_bytes = 512ull << 20;
    cfg->kv_dtype = -1;
    cfg->sched_max_batch_tokens = 512;
    cfg->sched_max_seqs = 64;
    cfg->sched_graphs = 1;
    cfg->server_port = 8080;
}

berth_status config_load(const char *path, struct berth_config **out)
{
    *out = NULL;
    struct berth_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        return berth_fail(BERTH_E_NOMEM, "%s: out of memory", path);
    apply_defaults(cfg);
    cfg->path = strdup(path);
    cfg->dir = dir_of(path);
    cfg->server_host = strdup("127.0.0.1");
    if (!cfg->path || !cfg->dir || !cfg->server_host) {
        config_free(cfg);
        return berth_fail(BERTH_E_NOMEM, "%s: out of memory", path);
    }

    struct parse_state ps = {.cfg = cfg, .cur_sec = -1};
    ps.f = fopen(path, "r");
    if (!ps.f) {
        berth_status st = berth_fail(BERTH_E_IO, "%s: cannot read: %s", path, strerror(errno));
        config_free(cfg);
        return st;
    }
    int ret = ini_parse_stream(read_line, &ps, on_key, &ps);
    fclose(ps.f);
    free(ps.linebuf);

    berth_status st = BERTH_OK;
    if (ps.read_errno) {
        st = berth_fail(BERTH_E_IO, "%s: cannot read: %s", path, strerror(ps.read_errno));
    } else if (ret == -2) {
        st = berth_fail(BERTH_E_NOMEM, "%s: out of memory", path);
    } else if (ret > 0 && (ps.err == BERTH_OK || ret < ps.err_line)) {
        int first = ret <= ps.first_char_cap ? ps.first_char[ret - 1] : 0;
        log_warnings(&ps, ret);
        st = berth_fail(BERTH_E_INVALID, "%s:%d: syntax error: %s", path, ret,
                        first == '[' ? "section header without closing ']'" : "expected 'key = value' or '[section]'");
    } else if (ps.err != BERTH_OK) {
        log_warnings(&ps, ps.err_line);
        st = berth_fail(ps.err, "%s", ps.errmsg);
    } else {
        log_warnings(&ps, INT_MAX);
    }
    free(ps.first_char);
    free(ps.warning_lines);
    if (st != BERTH_OK) {
        config_free(cfg);
        return st;
    }

    if (!ps.saw_plugins) {
        char *d = strdup(BERTH_DEFAULT_PLUGIN_DIR);
        if (!d || !append_str(&cfg->plugin_dirs, &cfg->plugin_dir_lines, &cfg->n_plugin_dirs, d, 0)) {
            free(d);
            config_free(cfg);
            return berth_fail(BERTH_E_NOMEM, "%s: out of memory", path);
        }
        cfg->default_plugin_dir = 1;
    }
    /* Sections no longer move: point each backend at its own. */
    for (int i = 0; i < cfg->n_backends; i++) {
        char name[CFG_MAX_SECTION + 16];
        snprintf(name, sizeof name, "backend.%s", cfg->backends[i].name);
        cfg->backends[i].section = config_section(cfg, name);
    }
    *out = cfg;
    return BERTH_OK;
}

void config_free(struct berth_config *cfg)
{
    if (!cfg)
        return;
    for (int i = 0; i < cfg->n_sections; i++) {
        struct cfg_section *s = &cfg->sections[i];
        for (int j = 0; j < s->n_entries; j++) {
            free(s->entries[j].key);
            free(s->entries[j].value);
        }
        free(s->entries);
        free(s->name);
    }
    free(cfg->sections);
    for (int i = 0; i < cfg->n_plugin_dirs; i++)
        free(cfg->plugin_dirs[i]);
    free(cfg->plugin_dirs);
    free(cfg->plugin_dir_lines);
    for (int i = 0; i < cfg->n_plugin_paths; i++)
        free(cfg->plugin_paths[i]);
    free(cfg->plugin_paths);
    free(cfg->plugin_path_lines);
    for (int i = 0; i < cfg->n_backends; i++)
        free(cfg->backends[i].name);
    free(cfg->backends);
    for (int i = 0; i < cfg->n_warnings; i++)
        free(cfg->warnings[i]);
    free(cfg->warnings);
    free(cfg->model_path);
    free(cfg->model_plugin);
    free(cfg->model_backend);
    free(cfg->server_host);
    free(cfg->path);
    free(cfg->dir);
    free(cfg);
}

const char *cfg_section_get(const struct cfg_section *sec, const char *key)
{
    if (!sec || !key)
        return NULL;
    for (int i = sec->n_entries - 1; i >= 0; i--)
        if (strcmp(sec->entries[i].key, key) == 0)
            return sec->entries[i].value;
    return NULL;
}

const struct cfg_section *config_section(const struct berth_config *cfg, const char *name)
{
    int i = find_section(cfg, name);
    return i >= 0 ? &cfg->sections[i] : NULL;
}

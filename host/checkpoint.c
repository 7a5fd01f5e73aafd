/* checkpoint.c — a Hugging Face checkpoint directory: config.json + safetensors shards (see checkpoint.h). */
#include "checkpoint.h"

#include "errors.h"
#include "json_path.h"
#include "safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CONFIG_LABEL "config.json"
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

/* One tensor of the checkpoint: the record inside its shard. */
struct ckpt_entry {
    const struct st_tensor *t;
    int shard;
};

/* What tensor_load made for one backend instance; freed through that backend in ckpt_close. */
struct ckpt_backend_state {
    berth_backend *be;
    const berth_backend_vtable *vt;
    berth_stream *stream;   /* upload path; made on first use */
    berth_buffer **wrapped; /* per shard, wrap path; NULL until first use */
    berth_buffer **bufs;    /* upload path: one per loaded tensor */
    size_t n_bufs, cap_bufs;
};

/* Mutable state behind the const checkpoint handle the services receive. */
struct ckpt_loads {
    pthread_mutex_t lock;
    struct ckpt_backend_state *states;
    size_t n_states;
};

struct berth_checkpoint {
    char *dir; /* as given, trailing '/' removed */
    json_t *config;
    struct st_file **shards;
    int n_shards;
    struct ckpt_entry *tensors; /* sorted by name */
    int64_t n_tensors;
    uint64_t total_bytes;
    struct ckpt_loads *loads;
};

typedef unsigned long long ull;

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Load a JSON file (object root) with "file:line:col: text" on syntax errors. */
static berth_status load_json_object(const char *path, json_t **out)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        return berth_fail(e == ENOENT ? BERTH_E_NOT_FOUND : BERTH_E_IO, "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode))
        return berth_fail(BERTH_E_INVALID, "%s: not a regular file", path);
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (jerr.line > 0)
            return berth_fail(BERTH_E_INVALID, "%s:%d:%d: %s", path, jerr.line, jerr.column, jerr.text);
        return berth_fail(BERTH_E_IO, "%s: %s", path, jerr.text);
    }
    if (!json_is_object(root)) {
        json_decref(root);
        return berth_fail(BERTH_E_INVALID, "%s: the top level is not a JSON object", path);
    }
    *out = root;
    return BERTH_OK;
}

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entry(const void *a, const void *b)
{
    const struct ckpt_entry *x = a, *y = b;
    int c = strcmp(x->t->name, y->t->name);
    return c ? c : (x->shard > y->shard) - (x->shard < y->shard);
}

/* Open one shard; for a file named by the index, say so when it cannot be opened at all. */
static berth_status open_shard(berth_checkpoint *ck, const char *name, const char *named_in)
{
    char *path = join(ck->dir, name);
    if (!path)
        return berth_fail(BERTH_E_NOMEM, "out of memory");
    berth_status st = st_open(path, &ck->shards[ck->n_shards]);
    free(path);
    if (st == BERTH_OK) {
        ck->n_shards++;
    } else if (named_in && (st == BERTH_E_NOT_FOUND || st == BERTH_E_IO)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", berth_last_error());
        berth_fail(st, "%s (shard named in %s)", msg, named_in);
    }
    return st;
}

static int has_control_char(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 1;
    return 0;
}

/* Sharded layout: open every distinct shard of weight_map once. */
static berth_status open_sharded(berth_checkpoint *ck, const char *index_path, const json_t *wmap)
{
    size_t n = json_object_size(wmap);
    if (n == 0)
        return berth_fail(BERTH_E_INVALID, "%s: weight_map lists no tensors", index_path);
    const char **names = malloc(n * sizeof *names);
    if (!names)
        return berth_fail(BERTH_E_NOMEM, "%s: out of memory", index_path);
    size_t k = 0;
    const char *tname;
    json_t *v;
    berth_status st = BERTH_OK;
    json_object_foreach((json_t *)wmap, tname, v) {
        if (!json_is_string(v)) {
            st = berth_fail(BERTH_E_INVALID, "%s: weight_map: tensor '%s': shard is %s, not a file name", index_path,
                            tname, jpath_kind_name(v));
            goto out;
        }
        const char *file = json_string_value(v);
        if (has_control_char(tname) || has_control_char(file)) {
            /* Names end up in one-line messages. */
            st = berth_fail(BERTH_E_INVALID, "%s: weight_map: a tensor or shard name contains a control character",
                            index_path);
            goto out;
        }
        if (!*file || strchr(file, '/') || strstr(file, "..")) {
            st = berth_fail(BERTH_E_INVALID,
                            "%s: weight_map: tensor '%s': shard \"%s\" is not a plain file name in the checkpoint "
                            "directory",
                            index_path, tname, file);
            goto out;
        }
        names[k++] = file;
    }
    qsort(names, k, sizeof *names, cmp_cstr);
    size_t distinct = 0;
    for (size_t i = 0; i < k; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0)
            names[distinct++] = names[i];
    if (!(ck->shards = calloc(distinct, sizeof *ck->shards))) {
        st = berth_fail(BERTH_E_NOMEM, "%s: out of memory", index_path);
        goto out;
    }
    for (size_t i = 0; i < distinct && st == BERTH_OK; i++)
        st = open_shard(ck, names[i], index_path);
out:
    free(names);
    return st;
}

static int shard_by_basename(const berth_checkpoint *ck, const char *file)
{
    size_t dl = strlen(ck->dir);
    for (int i = 0; i < ck->n_shards; i++) {
        const char *p = ck->shards[i]->path;
        if (strncmp(p, ck->dir, dl) == 0 && p[dl] == '/' && strcmp(p + dl + 1, file) == 0)
            return i;
    }
    return -1;
}

/* Merge the shards' tensors into one sorted list; reject duplicate names. */
static berth_status build_index(berth_checkpoint *ck)
{
    int64_t n = 0;
    for (int i = 0; i < ck->n_shards; i++) {
        n += ck->shards[i]->n_tensors;
        ck->total_bytes += ck->shards[i]->tensor_bytes;
    }
    if (!(ck->tensors = malloc((n ? (size_t)n : 1) * sizeof *ck->tensors)))
        return berth_fail(BERTH_E_NOMEM, "%s: out of memory for %lld tensors", ck->dir, (long long)n);
    for (int i = 0; i < ck->n_shards; i++)
        for (int64_t j = 0; j < ck->shards[i]->n_tensors; j++)
            ck->tensors[ck->n_tensors++] = (struct ckpt_entry){&ck->shards[i]->tensors[j], i};
    qsort(ck->tensors, (size_t)n, sizeof *ck->tensors, cmp_entry);
    for (int64_t i = 1; i < n; i++) {
        const struct ckpt_entry *a = &ck->tensors[i - 1], *b = &ck->tensors[i];
        if (strcmp(a->t->name, b->t->name) == 0)
            return berth_fail(BERTH_E_INVALID, "tensor '%s' is in both %s and %s", a->t->name,
                              ck->shards[a->shard]->path, ck->shards[b->shard]->path);
    }
    return BERTH_OK;
}

/* The index and the shards must agree tensor by tensor. */
static berth_status check_index(const berth_checkpoint *ck, const char *index_path, const json_t *wmap)
{
    const char *tname;
    json_t *v;
    json_object_foreach((json_t *)wmap, tname, v) {
        int s = shard_by_basename(ck, json_string_value(v));
        if (s < 0 || !st_find(ck->shards[s], tname))
            return berth_fail(BERTH_E_INVALID, "%s: tensor '%s' is mapped to %s/%s, which does not contain it",
                              index_path, tname, ck->dir, json_string_value(v));
    }
    for (int64_t i = 0; i < ck->n_tensors; i++) {
        const struct ckpt_entry *e = &ck->tensors[i];
        const json_t *m = json_object_get(wmap, e->t->name);
        if (!m)
            return berth_fail(BERTH_E_INVALID, "%s: tensor '%s' is not listed in %s", ck->shards[e->shard]->path,
                              e->t->name, index_path);
        if (shard_by_basename(ck, json_string_value(m)) != e->shard)
            return berth_fail(BERTH_E_INVALID, "%s: tensor '%s' is listed in %s under %s", ck->shards[e->shard]->path,
                              e->t->name, index_path, json_string_value(m));
    }
    return BERTH_OK;
}

static berth_status open_weights(berth_checkpoint *ck)
{
    char *index_path = join(ck->dir, INDEX_NAME);
    if (!index_path)
        return berth_fail(BERTH_E_NOMEM, "out of memory");
    berth_status st;
    struct stat sb;
    if (stat(index_path, &sb) == 0) {
        json_t *index = NULL;
        if ((st = load_json_object(index_path, &index)) == BERTH_OK) {
            const json_t *wmap = json_object_get(index, "weight_map");
            if (!json_is_object(wmap))
                st = berth_fail(BERTH_E_INVALID, "%s: weight_map is missing or not an object", index_path);
            else if ((st = open_sharded(ck, index_path, wmap)) == BERTH_OK && (st = build_index(ck)) == BERTH_OK)
                st = check_index(ck, index_path, wmap);
        }
        json_decref(index);
    } else {
        struct stat sb1;
        char *single = join(ck->dir, SINGLE_NAME);
        if (!single)
            st = berth_fail(BERTH_E_NOMEM, "out of memory");
        else if (stat(single, &sb1) != 0 && errno == ENOENT)
            st = berth_fail(BERTH_E_NOT_FOUND, "%s: no %s or %s", ck->dir, SINGLE_NAME, INDEX_NAME);
        else if (!(ck->shards = calloc(1, sizeof *ck->shards)))
            st = berth_fail(BERTH_E_NOMEM, "out of memory");
        else if ((st = open_shard(ck, SINGLE_NAME, NULL)) == BERTH_OK)
            st = build_index(ck);
        free(single);
    }
    free(index_path);
    return st;
}

berth_status ckpt_open(const char *dir, berth_checkpoint **out)
{
    if (!dir || !*dir)
        return berth_fail(BERTH_E_INVALID, "checkpoint directory: empty path");
    berth_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir)) || !(ck->loads = calloc(1, sizeof *ck->loads))) {
        if (ck)
            free(ck->dir);
        free(ck);
        return berth_fail(BERTH_E_NOMEM, "%s: out of memory", dir);
    }
    pthread_mutex_init(&ck->loads->lock, NULL);
    for (size_t n = strlen(ck->dir); n > 1 && ck->dir[n - 1] == '/'; n--)
        ck->dir[n - 1] = '\0';

    berth_status st;
    struct stat sb;
    char *config_path = NULL;
    if (stat(ck->dir, &sb) != 0) {
        int e = errno;
        st = berth_fail(e == ENOENT ? BERTH_E_NOT_FOUND : BERTH_E_IO, "%s: %s", ck->dir, strerror(e));
    } else if (!S_ISDIR(sb.st_mode)) {
        st = berth_fail(BERTH_E_INVALID, "%s: not a directory (expected a checkpoint directory with config.json)",
                        ck->dir);
    } else if (!(config_path = join(ck->dir, "config.json"))) {
        st = berth_fail(BERTH_E_NOMEM, "out of memory");
    } else if ((st = load_json_object(config_path, &ck->config)) == BERTH_OK) {
        st = open_weights(ck);
    }
    free(config_path);
    if (st != BERTH_OK) {
        ckpt_close(ck);
        return st;
    }
    *out = ck;
    return BERTH_OK;
}

void ckpt_close(berth_checkpoint *ck)
{
    if (!ck)
        return;
    if (ck->loads) {
        for (size_t i = 0; i < ck->loads->n_states; i++) {
            struct ckpt_backend_state *s = &ck->loads->states[i];
            for (size_t j = 0; j < s->n_bufs; j++)
                s->vt->buffer_free(s->be, s->bufs[j]);
            for (int j = 0; s->wrapped && j < ck->n_shards; j++)
                if (s->wrapped[j])
                    s->vt->buffer_free(s->be, s->wrapped[j]);
            if (s->stream)
                s->vt->stream_destroy(s->be, s->stream);
            free(s->bufs);
            free(s->wrapped);
        }
        free(ck->loads->states);
        pthread_mutex_destroy(&ck->loads->lock);
        free(ck->loads);
    }
    for (int i = 0; i < ck->n_shards; i++)
        st_close(ck->shards[i]);
    free(ck->shards);
    free(ck->tensors);
    json_decref(ck->config);
    free(ck->dir);
    free(ck);
}

const char *ckpt_model_type(const berth_checkpoint *ck)
{
    return json_string_value(json_object_get(ck->config, "model_type"));
}

uint64_t ckpt_total_bytes(const berth_checkpoint *ck) { return ck->total_bytes; }

berth_status ckpt_check_fits(const berth_checkpoint *ck, uint64_t available, const char *what)
{
    if (ck->total_bytes <= available)
        return BERTH_OK;
    return berth_fail(BERTH_E_NOMEM, "model %s: weights need %.2f GB but %s has %.2f GB available", ck->dir,
                      (double)ck->total_bytes / 1e9, what, (double)available / 1e9);
}

void ckpt_prefetch(const berth_checkpoint *ck, void (*cb)(double frac, void *arg), void *arg)
{
    const uint64_t chunk = 64ull << 20;
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t page = pg > 0 ? (uint64_t)pg : 4096, total = 0, done = 0;
    for (int i = 0; i < ck->n_shards; i++) {
        total += ck->shards[i]->map_size;
        /* Advice only: a failure just means no read-ahead. */
        madvise((void *)ck->shards[i]->map, (size_t)ck->shards[i]->map_size, MADV_WILLNEED);
    }
    for (int i = 0; i < ck->n_shards; i++) {
        const volatile uint8_t *p = ck->shards[i]->map;
        uint64_t size = ck->shards[i]->map_size;
        for (uint64_t off = 0; off < size; off += chunk) {
            uint64_t end = off + chunk < size ? off + chunk : size;
            uint8_t sink = 0;
            for (uint64_t o = off; o < end; o += page)
                sink ^= p[o]; /* fault the page in */
            (void)sink;
            done += end - off;
            if (cb)
                cb(total ? (double)done / (double)total : 1.0, arg);
        }
    }
    if (cb && total == 0)
        cb(1.0, arg);
}

/* ------------------------------------------------------------------------------------------------------------
 * Services. */

int32_t ckpt_svc_cfg_type(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path)
{
    const json_t *v;
    char saved[1024];
    /* A type query is not an error: keep the caller's last error untouched. */
    snprintf(saved, sizeof saved, "%s", berth_last_error());
    berth_status st = jpath_get(ck->config, CONFIG_LABEL, path, &v);
    if (st != BERTH_OK) {
        berth_fail(BERTH_OK, "%s", saved);
        return BERTH_JSON_MISSING;
    }
    return jpath_kind(v);
}

berth_status ckpt_svc_cfg_int(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out)
{
    return jpath_int(ck->config, CONFIG_LABEL, path, out);
}

berth_status ckpt_svc_cfg_real(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, double *out)
{
    return jpath_real(ck->config, CONFIG_LABEL, path, out);
}

berth_status ckpt_svc_cfg_bool(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int32_t *out)
{
    return jpath_bool(ck->config, CONFIG_LABEL, path, out);
}

berth_status ckpt_svc_cfg_string(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path,
                                 const char **out)
{
    return jpath_string(ck->config, CONFIG_LABEL, path, out);
}

berth_status ckpt_svc_cfg_len(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out)
{
    return jpath_len(ck->config, CONFIG_LABEL, path, out);
}

berth_status ckpt_svc_cfg_key(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t idx,
                              const char **out)
{
    return jpath_key(ck->config, CONFIG_LABEL, path, idx, out);
}

const char *ckpt_svc_dir(berth_host_ctx *ctx, const berth_checkpoint *ck) { return ck->dir; }

int64_t ckpt_svc_tensor_count(berth_host_ctx *ctx, const berth_checkpoint *ck) { return ck->n_tensors; }

static const struct ckpt_entry *find_entry(const berth_checkpoint *ck, const char *name)
{
    size_t lo = 0, hi = (size_t)ck->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->tensors[mid].t->name, name);
        if (c == 0)
            return &ck->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static berth_status unsupported_dtype(const berth_checkpoint *ck, const struct ckpt_entry *e)
{
    return berth_fail(BERTH_E_UNSUPPORTED,
                      "%s: tensor '%s': dtype %s is not supported by berth (F32, F16, BF16, I32, I64, U8 are)",
                      ck->shards[e->shard]->path, e->t->name, e->t->dtype_name);
}

/* The shard's file name inside the directory (every shard path is dir + "/" + name, see open_shard). */
static const char *shard_file(const berth_checkpoint *ck, int shard)
{
    const char *p = ck->shards[shard]->path, *slash = strrchr(p, '/');
    return slash ? slash + 1 : p;
}

/* Fill the fields of *out that its struct_size covers. */
static berth_status fill_info(const berth_checkpoint *ck, const struct ckpt_entry *e, berth_tensor_info *out)
{
    const struct st_tensor *t = e->t;
    if (BERTH_HAS(out, berth_tensor_info, dtype))
        out->dtype = t->dtype;
    if (BERTH_HAS(out, berth_tensor_info, name))
        out->name = t->name;
    if (BERTH_HAS(out, berth_tensor_info, data))
        out->data = st_tensor_data(ck->shards[e->shard], t);
    if (BERTH_HAS(out, berth_tensor_info, nbytes))
        out->nbytes = t->end - t->begin;
    if (BERTH_HAS(out, berth_tensor_info, ndim))
        out->ndim = t->ndim;
    if (BERTH_HAS(out, berth_tensor_info, reserved0))
        out->reserved0 = 0;
    if (BERTH_HAS(out, berth_tensor_info, shape))
        for (int i = 0; i < ST_MAX_DIMS; i++)
            out->shape[i] = i < t->ndim ? t->shape[i] : 0;
    if (BERTH_HAS(out, berth_tensor_info, file))
        out->file = shard_file(ck, e->shard);
    return t->dtype < 0 ? unsupported_dtype(ck, e) : BERTH_OK;
}

berth_status ckpt_svc_tensor_at(berth_host_ctx *ctx, const berth_checkpoint *ck, int64_t idx,
                                berth_tensor_info *out)
{
    if (!out)
        return berth_fail(BERTH_E_INVALID, "%s: tensor_at: NULL output", ck->dir);
    if (idx < 0 || idx >= ck->n_tensors)
        return berth_fail(BERTH_E_NOT_FOUND, "%s: tensor index %lld is out of range (%lld tensors)", ck->dir,
                          (long long)idx, (long long)ck->n_tensors);
    return fill_info(ck, &ck->tensors[idx], out);
}

berth_status ckpt_svc_tensor_find(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *name,
                                  berth_tensor_info *out)
{
    if (!out)
        return berth_fail(BERTH_E_INVALID, "%s: tensor_find: NULL output", ck->dir);
    const struct ckpt_entry *e = name ? find_entry(ck, name) : NULL;
    if (!e)
        return berth_fail(BERTH_E_NOT_FOUND, "%s: no tensor '%s' in the checkpoint", ck->dir, name ? name : "(null)");
    return fill_info(ck, e, out);
}

/* The state for backend instance be, created on first use. Called with the lock held. */
static struct ckpt_backend_state *backend_state(const berth_checkpoint *ck, const berth_backend_api *api)
{
    struct ckpt_loads *L = ck->loads;
    for (size_t i = 0; i < L->n_states; i++)
        if (L->states[i].be == api->be)
            return &L->states[i];
    struct ckpt_backend_state *s = realloc(L->states, (L->n_states + 1) * sizeof *s);
    if (!s)
        return NULL;
    L->states = s;
    s = &L->states[L->n_states];
    *s = (struct ckpt_backend_state){.be = api->be, .vt = api->vt};
    if (!(s->wrapped = calloc((size_t)ck->n_shards ? (size_t)ck->n_shards : 1, sizeof *s->wrapped)))
        return NULL;
    L->n_states++;
    return s;
}

/* Re-raise the backend's message with the file and tensor in front. */
static berth_status backend_failed(berth_status st, const char *path, const char *name, const char *what)
{
    char msg[768];
    snprintf(msg, sizeof msg, "%s", berth_last_error());
    return berth_fail(st, "%s: tensor '%s': %s failed: %s", path, name, what, *msg ? msg : berth_status_str(st));
}

/* Wrap path: a view into the (once-wrapped) whole mapped shard. */
static berth_status load_wrapped(const berth_checkpoint *ck, const berth_backend_api *api,
                                 struct ckpt_backend_state *s, const struct ckpt_entry *e, berth_tensor *out)
{
    const struct st_file *f = ck->shards[e->shard];
    if (!s->wrapped[e->shard]) {
        berth_clear_error();
        berth_status st = api->vt->buffer_wrap_host(api->be, (void *)f->map, f->map_size, 1, &s->wrapped[e->shard]);
        if (st != BERTH_OK) {
            s->wrapped[e->shard] = NULL;
            return backend_failed(st, f->path, e->t->name, "buffer_wrap_host of the mapped file");
        }
    }
    out->buf = s->wrapped[e->shard];
    out->offset = f->data_offset + e->t->begin;
    return BERTH_OK;
}

/* Upload path: a WEIGHTS buffer of its own, filled from the mapping. */
static berth_status load_uploaded(const berth_checkpoint *ck, const berth_backend_api *api,
                                  struct ckpt_backend_state *s, const struct ckpt_entry *e, berth_tensor *out)
{
    const struct st_file *f = ck->shards[e->shard];
    const berth_backend_vtable *vt = api->vt;
    uint64_t nbytes = e->t->end - e->t->begin;
    berth_status st;
    berth_clear_error();
    if (!s->stream && (st = vt->stream_create(api->be, &s->stream)) != BERTH_OK) {
        s->stream = NULL;
        return backend_failed(st, f->path, e->t->name, "stream_create");
    }
    if (s->n_bufs == s->cap_bufs) {
        size_t cap = s->cap_bufs ? 2 * s->cap_bufs : 64;
        berth_buffer **b = realloc(s->bufs, cap * sizeof *b);
        if (!b)
            return berth_fail(BERTH_E_NOMEM, "%s: tensor '%s': out of memory", f->path, e->t->name);
        s->bufs = b;
        s->cap_bufs = cap;
    }
    berth_buffer *buf = NULL;
    /* A zero-size tensor still gets a (1-byte) buffer so out->buf is never NULL (NULL means "absent"). */
    if ((st = vt->buffer_alloc(api->be, nbytes ? nbytes : 1, BERTH_USAGE_WEIGHTS, &buf)) != BERTH_OK) {
        char what[64];
        snprintf(what, sizeof what, "buffer_alloc of %llu bytes", (ull)nbytes);
        return backend_failed(st, f->path, e->t->name, what);
    }
    if (nbytes) {
        if ((st = vt->buffer_upload(api->be, s->stream, buf, 0, st_tensor_data(f, e->t), nbytes)) != BERTH_OK ||
            (st = vt->stream_sync(api->be, s->stream)) != BERTH_OK) {
            backend_failed(st, f->path, e->t->name, "upload");
            vt->buffer_free(api->be, buf);
            return st;
        }
    }
    s->bufs[s->n_bufs++] = buf;
    out->buf = buf;
    out->offset = 0;
    return BERTH_OK;
}

berth_status ckpt_svc_tensor_load(berth_host_ctx *ctx, const berth_checkpoint *ck, const berth_backend_api *be,
                                  const char *name, berth_tensor *out)
{
    if (!be || !be->vt || !be->be || !out)
        return berth_fail(BERTH_E_INVALID, "tensor_load: NULL backend or output");
    const struct ckpt_entry *e = name ? find_entry(ck, name) : NULL;
    if (!e)
        return berth_fail(BERTH_E_NOT_FOUND, "%s: no tensor '%s' in the checkpoint", ck->dir, name ? name : "(null)");
    const struct st_tensor *t = e->t;
    if (t->dtype < 0)
        return unsupported_dtype(ck, e);
    if (t->ndim > 4)
        return berth_fail(BERTH_E_UNSUPPORTED, "%s: tensor '%s': %d dimensions, berth tensors hold at most 4",
                          ck->shards[e->shard]->path, t->name, t->ndim);

    berth_tensor r = {.dtype = t->dtype, .ndim = t->ndim > 0 ? t->ndim : 1};
    for (int i = 0; i < 4; i++)
        r.ne[i] = i < t->ndim ? t->shape[t->ndim - 1 - i] : 1;
    r.nb[0] = t->elem_size;
    for (int i = 1; i < 4; i++)
        r.nb[i] = r.nb[i - 1] * r.ne[i - 1];

    int wrap = be->device && (be->device->caps & BERTH_CAP_WRAP_HOST) && be->vt->buffer_wrap_host;
    pthread_mutex_lock(&ck->loads->lock);
    berth_status st;
    struct ckpt_backend_state *s = backend_state(ck, be);
    if (!s)
        st = berth_fail(BERTH_E_NOMEM, "%s: tensor '%s': out of memory", ck->dir, t->name);
    else if (wrap)
        st = load_wrapped(ck, be, s, e, &r);
    else
        st = load_uploaded(ck, be, s, e, &r);
    pthread_mutex_unlock(&ck->loads->lock);
    if (st == BERTH_OK)
        *out = r;
    return st;
}

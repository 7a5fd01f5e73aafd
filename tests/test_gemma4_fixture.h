/*
 * test_gemma4_fixture.h — shared by the Gemma 4 end-to-end tests: find the reference fixtures
 * (tests/fixtures/gemma4/<variant>/reference.json), read them, and open a checkpoint through the real host path
 * (config -> registry -> checkpoint -> selection -> runner) on the CPU backend (or the one BERTH_TEST_BACKEND names). Header-only, static functions:
 * each test binary includes it once.
 *
 * reference.json: {"variant", "weights_dtype", "vocab_size", "prompts": [{"ids": [...], "logits": "prompt0.f32"
 * (raw LE f32 [len(ids), V]), "greedy": [24 ids], "full_logits": "prompt0_full.f32" (LE f32 [len(ids)+24, V])}]}
 */
#ifndef BERTH_TEST_GEMMA4_FIXTURE_H
#define BERTH_TEST_GEMMA4_FIXTURE_H

#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "registry.h"
#include "runner.h"

/* The end-to-end tests run on the CPU backend by default. BERTH_TEST_BACKEND=cuda (with BERTH_TEST_CONFIG naming a
 * config that enables it, tests/meson.build's *_cuda tests) runs the same tests on the GPU; they skip (77) when the
 * CUDA plugin sees no device. BERTH_TEST_TOL overrides the logit tolerance (1e-4 on the CPU; the CUDA issue allows
 * 1e-3 for the fp32 GPU mode, whose summation orders differ from PyTorch's CPU ones). */
#define G4_TOL g4_tol()
/* Not every test uses every helper. */
#define G4_STATIC static __attribute__((unused))

struct g4_prompt {
    int32_t *ids;
    int32_t n;
    int32_t *greedy;
    int32_t n_greedy;
    char *logits_path;      /* [n, V] */
    char *full_logits_path; /* [n + n_greedy, V] */
    double hf_incremental;  /* the reference's own |cached decode - full forward| (0 when absent) */
};

struct g4_fixture {
    char *dir;
    char *variant;
    int32_t vocab;
    struct g4_prompt *prompts;
    int32_t n_prompts;
};

G4_STATIC char *g4_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    snprintf(s, n, "%s/%s", a, b);
    return s;
}

G4_STATIC const char *g4_env(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

G4_STATIC double g4_tol(void)
{
    const char *v = getenv("BERTH_TEST_TOL");
    return v && *v ? strtod(v, NULL) : 1e-4;
}

/* The config the e2e tests load (caller frees) and the backend they expect it to select. */
G4_STATIC char *g4_config_path(void)
{
    const char *v = getenv("BERTH_TEST_CONFIG");
    return v && *v ? strdup(v) : g4_join(g4_env("BERTH_BUILD_ROOT", "."), "tests/parity-cpu.ini");
}
G4_STATIC const char *g4_backend_name(void) { return g4_env("BERTH_TEST_BACKEND", "cpu"); }

/* For BERTH_TEST_BACKEND=cuda: does the build's CUDA plugin see a device? (Probed in a child process, so this
 * process never touches CUDA before check forks or the test opens the backend.) */
G4_STATIC int g4_backend_present(void)
{
    if (strcmp(g4_backend_name(), "cuda") != 0) return 1;
    char *so = g4_join(g4_env("BERTH_BUILD_ROOT", "."), "plugins/berth-backend-cuda.so");
    int present = 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
        berth_plugin_entry_fn entry = h ? (berth_plugin_entry_fn)dlsym(h, BERTH_PLUGIN_ENTRY_SYMBOL) : NULL;
        const berth_plugin_desc *d = entry ? entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR) : NULL;
        berth_host host;
        memset(&host, 0, sizeof host);
        host.struct_size = sizeof host;
        berth_probe_info pi;
        memset(&pi, 0, sizeof pi);
        pi.struct_size = sizeof pi;
        const berth_backend_vtable *vt = d ? (const berth_backend_vtable *)d->vtable : NULL;
        _exit(vt && vt->probe(&host, &pi) == BERTH_OK && pi.n_devices > 0 ? 0 : 1);
    }
    int status = 0;
    if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) present = 1;
    if (!present) printf("%s: the CUDA backend sees no device: skipped\n", so);
    free(so);
    return present;
}

/* tests/fixtures/gemma4 of the source tree. Caller frees. */
G4_STATIC char *g4_fixture_root(void) { return g4_join(g4_env("BERTH_SOURCE_ROOT", "."), "tests/fixtures/gemma4"); }

/* Variant folders holding a reference.json, sorted by name. Returns the count; *out caller frees (each + array). */
G4_STATIC int g4_list_fixtures(char ***out)
{
    *out = NULL;
    if (!g4_backend_present()) return 0;
    char *root = g4_fixture_root();
    DIR *d = opendir(root);
    int n = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char *dir = g4_join(root, e->d_name);
            char *ref = g4_join(dir, "reference.json");
            struct stat sb;
            if (stat(ref, &sb) == 0 && S_ISREG(sb.st_mode)) {
                *out = realloc(*out, (size_t)(n + 1) * sizeof **out);
                (*out)[n++] = dir;
            } else {
                free(dir);
            }
            free(ref);
        }
        closedir(d);
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp((*out)[j - 1], (*out)[j]) > 0; j--) {
            char *t = (*out)[j];
            (*out)[j] = (*out)[j - 1];
            (*out)[j - 1] = t;
        }
    free(root);
    return n;
}

G4_STATIC void g4_free_list(char **dirs, int n)
{
    for (int i = 0; i < n; i++) free(dirs[i]);
    free(dirs);
}

/* main() of a per-fixture test program: lists the fixtures into *dirs / *n (the test reads them by its loop
 * index), runs `test` once per fixture as suite `name` (120 s each), frees the list. Returns the exit status: 77
 * (skipped) without fixtures, 1 if a fixture failed, else 0. */
G4_STATIC int g4_run_per_fixture(const char *name, const TTest *test, char ***dirs, int *n)
{
    *n = g4_list_fixtures(dirs);
    if (*n == 0) {
        char *root = g4_fixture_root();
        printf("SKIP: no Gemma 4 fixtures (no %s/<variant>/reference.json yet)\n", root);
        free(root);
        return 77;
    }
    Suite *su = suite_create(name);
    TCase *tc = tcase_create("fixtures");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test, 0, *n);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    g4_free_list(*dirs, *n);
    *dirs = NULL;
    *n = 0;
    return failed ? 1 : 0;
}

G4_STATIC int32_t *g4_int_array(json_t *a, int32_t *n, const char *what, const char *file)
{
    ck_assert_msg(json_is_array(a), "%s: %s is not an array", file, what);
    *n = (int32_t)json_array_size(a);
    int32_t *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    for (int32_t i = 0; i < *n; i++) {
        json_t *x = json_array_get(a, (size_t)i);
        ck_assert_msg(json_is_integer(x), "%s: %s[%d] is not an integer", file, what, (int)i);
        v[i] = (int32_t)json_integer_value(x);
    }
    return v;
}

G4_STATIC void g4_load_fixture(const char *dir, struct g4_fixture *f)
{
    memset(f, 0, sizeof *f);
    f->dir = strdup(dir);
    char *path = g4_join(dir, "reference.json");
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    ck_assert_msg(root != NULL, "%s:%d: %s", path, err.line, err.text);
    json_t *v = json_object_get(root, "variant");
    f->variant = strdup(json_is_string(v) ? json_string_value(v) : dir);
    json_t *vs = json_object_get(root, "vocab_size");
    ck_assert_msg(json_is_integer(vs), "%s: vocab_size missing", path);
    f->vocab = (int32_t)json_integer_value(vs);
    json_t *ps = json_object_get(root, "prompts");
    ck_assert_msg(json_is_array(ps) && json_array_size(ps) > 0, "%s: no prompts", path);
    f->n_prompts = (int32_t)json_array_size(ps);
    f->prompts = calloc((size_t)f->n_prompts, sizeof *f->prompts);
    for (int32_t i = 0; i < f->n_prompts; i++) {
        json_t *p = json_array_get(ps, (size_t)i);
        struct g4_prompt *gp = &f->prompts[i];
        gp->ids = g4_int_array(json_object_get(p, "ids"), &gp->n, "ids", path);
        gp->greedy = g4_int_array(json_object_get(p, "greedy"), &gp->n_greedy, "greedy", path);
        json_t *l = json_object_get(p, "logits"), *fl = json_object_get(p, "full_logits");
        ck_assert_msg(json_is_string(l) && json_is_string(fl), "%s: prompt %d lacks logits/full_logits", path,
                      (int)i);
        gp->logits_path = g4_join(dir, json_string_value(l));
        json_t *inc = json_object_get(p, "incremental_max_abs");
        gp->hf_incremental = json_is_number(inc) ? json_number_value(inc) : 0.0;
        gp->full_logits_path = g4_join(dir, json_string_value(fl));
    }
    json_decref(root);
    free(path);
}

G4_STATIC void g4_free_fixture(struct g4_fixture *f)
{
    for (int32_t i = 0; i < f->n_prompts; i++) {
        free(f->prompts[i].ids);
        free(f->prompts[i].greedy);
        free(f->prompts[i].logits_path);
        free(f->prompts[i].full_logits_path);
    }
    free(f->prompts);
    free(f->variant);
    free(f->dir);
}

/* Read a raw LE f32 file of exactly rows x cols values. Caller frees. */
G4_STATIC float *g4_read_f32(const char *path, int64_t rows, int64_t cols)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    size_t n = (size_t)(rows * cols);
    float *v = malloc(n * sizeof *v + 1);
    size_t got = fread(v, sizeof *v, n + 1, fp);
    fclose(fp);
    ck_assert_msg(got == n, "%s: %zu floats, expected %lld x %lld", path, got, (long long)rows, (long long)cols);
    return v;
}

/* max |a - b| over n values; *where = index of the maximum. NaN anywhere counts as infinite. */
G4_STATIC double g4_max_abs(const float *a, const float *b, size_t n, size_t *where)
{
    double m = 0;
    *where = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) d = INFINITY;
        if (d > m) {
            m = d;
            *where = i;
        }
    }
    return m;
}

/* A checkpoint opened and loaded through the real host path. */
struct g4_session {
    struct berth_config *cfg;
    struct registry *reg;
    berth_checkpoint *ck;
    struct selection sel;
    int have_sel;
    struct runner *r;
};

G4_STATIC void g4_close(struct g4_session *s)
{
    runner_free(s->r);
    if (s->have_sel && s->sel.model) {
        ((const berth_model_vtable *)s->sel.model_plugin->desc->vtable)->destroy(s->sel.model);
        s->sel.model = NULL;
    }
    ckpt_close(s->ck);
    if (s->have_sel) selection_release(&s->sel);
    registry_free(s->reg);
    config_free(s->cfg);
    memset(s, 0, sizeof *s);
}

/* Open dir with the build's parity config (build/tests/parity-cpu.ini: CPU backend only). max_batch_tokens and
 * block_size 0 take the config's values. Asserts the CPU backend and the gemma4 plugin were chosen. */
G4_STATIC void g4_open(const char *dir, int32_t max_batch_tokens, int32_t block_size, struct g4_session *s)
{
    memset(s, 0, sizeof *s);
    char *cfg_path = g4_config_path();
    ck_assert_msg(config_load(cfg_path, &s->cfg) == BERTH_OK, "%s", berth_last_error());
    free(cfg_path);
    ck_assert_msg(registry_load(s->cfg, &s->reg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(ckpt_open(dir, &s->ck) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(registry_select(s->reg, s->ck, &s->sel) == BERTH_OK, "%s: %s\n%s", dir, berth_last_error(),
                  s->sel.why);
    s->have_sel = 1;
    ck_assert_str_eq(s->sel.backend_plugin->desc->name, g4_backend_name());
    ck_assert_str_eq(s->sel.model_plugin->desc->name, "gemma4");
    struct runner_config rc;
    memset(&rc, 0, sizeof rc);
    rc.be = &s->sel.api;
    rc.mvt = s->sel.model_plugin->desc->vtable;
    rc.model = s->sel.model;
    rc.ck = s->ck;
    rc.model_dir = dir;
    rc.max_batch_tokens = max_batch_tokens > 0 ? max_batch_tokens : s->cfg->sched_max_batch_tokens;
    rc.max_seqs = 1;
    rc.kv_block_size = block_size > 0 ? block_size : s->cfg->kv_block_size;
    rc.kv_memory = s->cfg->kv_memory_bytes;
    rc.kv_dtype = s->cfg->kv_dtype;
    rc.no_graphs = !s->cfg->sched_graphs;
    ck_assert_msg(runner_create(&rc, &s->r) == BERTH_OK, "%s: %s", dir, berth_last_error());
}

/* The named counter of the model plugin, or -1 when it has none by that name. */
G4_STATIC int64_t g4_model_counter(const struct runner *r, const char *name)
{
    berth_counter c[32];
    int32_t n = 0;
    if (runner_model_counters(r, c, 32, &n) != BERTH_OK) return -1;
    for (int32_t i = 0; i < n && i < 32; i++)
        if (c[i].name && strcmp(c[i].name, name) == 0) return c[i].value;
    return -1;
}

#endif

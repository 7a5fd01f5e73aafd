/*
 * bench_gemma4.c — end-to-end CPU benchmark of a Gemma 4 checkpoint through the same path as `berth generate`
 * (config -> plugins -> checkpoint -> model plugin + backend -> runner), against the machine's memory bandwidth.
 *
 *   bench_gemma4 --config F --model DIR [--prompt-len 512] [--gen-len 128] [--threads N] [--repeat R]
 *
 * Per repeat (after one untimed warm-up of the same shape): prefill of one prompt of prompt-len tokens through
 * runner_prefill (synced), then gen-len single-token decode steps, each runner_decode + greedy runner_sample_row
 * (the sample reads the id back, so every step is complete when timed). Clock: CLOCK_MONOTONIC.
 *
 * Decode floor = matrix bytes per decode step / memory bandwidth. Bytes per step, from the checkpoint's tensor
 * list (weights are used as stored: the CPU backend wraps the mapping):
 *   - every 2-D tensor is a matrix some decode step multiplies by (q/k/v/o, gate/up/down, per-layer projections),
 *     except:
 *   - "*embed_tokens.weight" is the LM head when the checkpoint has no "lm_head.weight" (tied embeddings) and is
 *     counted once; with an "lm_head.weight" that one is counted and embed_tokens (only gathered) is not;
 *   - "*embed_tokens_per_layer*" (per-layer input tables, only gathered) is not counted;
 *   - tensors of vision/audio towers (names containing "vision" or "audio") are not counted (text decode does
 *     not run them);
 *   - 1-D tensors (norms, scalars) and the KV cache are not counted (not matrices).
 * Bandwidth: N threads (N = the backend's thread count, its device compute_units) each memcpy a disjoint slice of
 * a source buffer into a destination buffer, each buffer >= 8x L3 (at least 256 MiB), bytes read + written per
 * second, best of BW_PASSES passes; measured once before and once after the timed runs, the better one is used.
 *
 * --threads N overrides [backend.cpu] threads of the config in memory (the section must exist).
 * Output: one line per repeat, then the table (medians over repeats, with min..max when R > 1).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "host_services.h"
#include "registry.h"
#include "runner.h"

#define BW_PASSES 10
#define BW_MIN_BYTES (256ull << 20)
#define BW_L3_FACTOR 8
#define WARMUP_DECODE_STEPS 8

static const char usage[] =
    "usage: bench_gemma4 --config FILE --model DIR [--prompt-len 512] [--gen-len 128] [--threads N] [--repeat R]\n"
    "  --config FILE      the berth INI config (e.g. configs/cpu.ini)\n"
    "  --model DIR        Hugging Face Gemma 4 checkpoint (bench/gen_bench_checkpoint.py --out DIR)\n"
    "  --prompt-len N     prompt tokens prefilled per repeat (default 512)\n"
    "  --gen-len N        single-token decode steps per repeat (default 128)\n"
    "  --threads N        override [backend.cpu] threads (default: the config's value)\n"
    "  --repeat R         timed repeats after the warm-up (default 3)\n";

struct bench_args {
    const char *config_path;
    const char *model_dir;
    int32_t prompt_len;
    int32_t gen_len;
    int32_t threads; /* -1: as configured */
    int32_t repeat;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_count(const char *s, long lo, long hi, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int32_t)v;
    return 0;
}

static int usage_error(const char *fmt, const char *arg)
{
    fputs("bench_gemma4: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}

/* 0 ok, 1 help printed, 2 usage error printed. */
static int parse_args(int argc, char **argv, struct bench_args *a)
{
    *a = (struct bench_args){NULL, NULL, 512, 128, -1, 3};
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (strcmp(o, "-h") == 0 || strcmp(o, "--help") == 0) {
            fputs(usage, stdout);
            return 1;
        }
        static const char *const known[] = {"--config", "--model", "--prompt-len", "--gen-len", "--threads",
                                            "--repeat"};
        int is_known = 0;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) is_known |= strcmp(o, known[k]) == 0;
        if (!is_known) return usage_error("unknown argument '%s'", o);
        if (i + 1 >= argc) return usage_error("%s needs a value", o);
        const char *v = argv[++i];
        if (strcmp(o, "--config") == 0) {
            a->config_path = v;
        } else if (strcmp(o, "--model") == 0) {
            a->model_dir = v;
        } else if (strcmp(o, "--prompt-len") == 0) {
            if (parse_count(v, 1, INT32_MAX, &a->prompt_len))
                return usage_error("--prompt-len '%s' is not a count >= 1", v);
        } else if (strcmp(o, "--gen-len") == 0) {
            if (parse_count(v, 1, INT32_MAX, &a->gen_len))
                return usage_error("--gen-len '%s' is not a count >= 1", v);
        } else if (strcmp(o, "--threads") == 0) {
            if (parse_count(v, 1, 1024, &a->threads))
                return usage_error("--threads '%s' is not a count in 1..1024", v);
        } else { /* --repeat */
            if (parse_count(v, 1, 1000, &a->repeat))
                return usage_error("--repeat '%s' is not a count in 1..1000", v);
        }
    }
    if (!a->config_path) return usage_error("%s", "--config FILE is required");
    if (!a->model_dir) return usage_error("%s", "--model DIR is required");
    return 0;
}

/* Replace (or add) [backend.cpu] threads in the loaded config, before the registry hands the section to the
 * plugin. Adding an entry reallocates only that section's entry array; nothing holds pointers into it yet. */
static berth_status override_threads(struct berth_config *cfg, int32_t threads)
{
    struct cfg_section *sec = NULL;
    for (int i = 0; i < cfg->n_sections; i++)
        if (strcmp(cfg->sections[i].name, "backend.cpu") == 0) sec = &cfg->sections[i];
    if (!sec) return berth_fail(BERTH_E_INVALID, "%s: --threads needs a [backend.cpu] section", cfg->path);
    char text[16];
    snprintf(text, sizeof text, "%d", (int)threads);
    char *value = strdup(text);
    if (!value) return berth_fail(BERTH_E_NOMEM, "out of memory");
    for (int i = 0; i < sec->n_entries; i++)
        if (strcmp(sec->entries[i].key, "threads") == 0) {
            free(sec->entries[i].value);
            sec->entries[i].value = value;
            return BERTH_OK;
        }
    char *key = strdup("threads");
    struct cfg_entry *e = realloc(sec->entries, sizeof *e * (size_t)(sec->n_entries + 1));
    if (!key || !e) {
        free(key);
        free(value);
        if (e) sec->entries = e;
        return berth_fail(BERTH_E_NOMEM, "out of memory");
    }
    sec->entries = e;
    sec->entries[sec->n_entries++] = (struct cfg_entry){key, value, 0};
    return BERTH_OK;
}

/* ---- decode bytes per step --------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Matrix bytes one decode step reads (the rule in the file comment); *n_mats = how many matrices. */
static berth_status decode_matrix_bytes(const berth_checkpoint *ck, uint64_t *bytes, int32_t *n_mats)
{
    int64_t n = ckpt_svc_tensor_count(NULL, ck);
    int has_lm_head = 0;
    berth_tensor_info ti;
    for (int64_t i = 0; i < n; i++) {
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        if (ckpt_svc_tensor_at(NULL, ck, i, &ti) == BERTH_OK && ends_with(ti.name, "lm_head.weight"))
            has_lm_head = 1;
    }
    uint64_t total = 0;
    int32_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        memset(&ti, 0, sizeof ti);
        ti.struct_size = sizeof ti;
        /* Unsupported dtypes fill ti and return an error; they cannot be a weight the model multiplies by. */
        if (ckpt_svc_tensor_at(NULL, ck, i, &ti) != BERTH_OK || ti.ndim != 2) continue;
        if (strstr(ti.name, "vision") || strstr(ti.name, "audio")) continue;
        if (strstr(ti.name, "embed_tokens_per_layer")) continue;
        if (ends_with(ti.name, "embed_tokens.weight") && has_lm_head) continue;
        total += ti.nbytes;
        count++;
    }
    berth_clear_error();
    if (count == 0) return berth_fail(BERTH_E_INVALID, "%s: no 2-D weights in the checkpoint", ckpt_svc_dir(NULL, ck));
    *bytes = total;
    *n_mats = count;
    return BERTH_OK;
}

/* ---- memory bandwidth ------------------------------------------------------------------------------------- */

struct bw_job {
    const char *src;
    char *dst;
    size_t bytes;          /* whole buffer */
    int n_threads;
    pthread_barrier_t go, done;
};

struct bw_worker {
    struct bw_job *job;
    int tid;
    int passes;
};

static void bw_copy_slice(const struct bw_job *j, int tid)
{
    /* Slices on 4 KiB boundaries so no two threads share a page (or a cache line). */
    size_t pages = j->bytes >> 12;
    size_t lo = (pages * (size_t)tid / (size_t)j->n_threads) << 12;
    size_t hi = (pages * (size_t)(tid + 1) / (size_t)j->n_threads) << 12;
    memcpy(j->dst + lo, j->src + lo, hi - lo);
}

static void *bw_worker_main(void *arg)
{
    struct bw_worker *w = arg;
    for (int p = 0; p < w->passes; p++) {
        pthread_barrier_wait(&w->job->go);
        bw_copy_slice(w->job, w->tid);
        pthread_barrier_wait(&w->job->done);
    }
    return NULL;
}

/* L3 of cpu0 as the kernel reports it (what one core's cache domain holds), else glibc's figure, else 32 MiB.
 * sysfs goes first: under some hypervisors glibc's CPUID-derived LEVEL3_CACHE_SIZE is the whole socket's
 * (320 MiB on the 2-vCPU EPYC this was written on, whose sysfs says 32 MiB). */
static size_t l3_bytes(void)
{
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    unsigned long kb = 0;
    if (f) {
        if (fscanf(f, "%luK", &kb) != 1) kb = 0;
        fclose(f);
    }
    if (kb) return (size_t)kb << 10;
    long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return v > 0 ? (size_t)v : (size_t)32 << 20;
}

/* Best read+written bytes per second of BW_PASSES multithreaded memcpy passes. *buf_bytes = size of each buffer. */
static berth_status measure_bandwidth(int n_threads, double *best_bps, size_t *buf_bytes)
{
    size_t bytes = l3_bytes() * BW_L3_FACTOR;
    if (bytes < BW_MIN_BYTES) bytes = BW_MIN_BYTES;
    bytes = (bytes + 4095) & ~(size_t)4095;
    char *src = NULL, *dst = NULL;
    if (posix_memalign((void **)&src, 4096, bytes) || posix_memalign((void **)&dst, 4096, bytes)) {
        free(src);
        return berth_fail(BERTH_E_NOMEM, "bandwidth: cannot allocate 2 x %zu MiB", bytes >> 20);
    }
    memset(src, 1, bytes); /* fault both in before timing */
    memset(dst, 2, bytes);
    struct bw_job job;
    memset(&job, 0, sizeof job);
    job.src = src;
    job.dst = dst;
    job.bytes = bytes;
    job.n_threads = n_threads;
    pthread_barrier_init(&job.go, NULL, (unsigned)n_threads);
    pthread_barrier_init(&job.done, NULL, (unsigned)n_threads);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    struct bw_worker *w = calloc((size_t)n_threads, sizeof *w);
    int started = 0;
    berth_status st = BERTH_OK;
    if (!th || !w) st = berth_fail(BERTH_E_NOMEM, "bandwidth: out of memory");
    for (int t = 1; !st && t < n_threads; t++) {
        w[t] = (struct bw_worker){&job, t, BW_PASSES};
        int err = pthread_create(&th[t], NULL, bw_worker_main, &w[t]);
        if (err) st = berth_fail(BERTH_E_INTERNAL, "bandwidth: cannot start thread %d: %s", t, strerror(err));
        else started++;
    }
    double best = 0.0;
    if (!st) {
        /* The calling thread is worker 0 and times each pass between the two barriers. */
        for (int p = 0; p < BW_PASSES; p++) {
            pthread_barrier_wait(&job.go);
            double t0 = now_s();
            bw_copy_slice(&job, 0);
            pthread_barrier_wait(&job.done);
            double dt = now_s() - t0;
            double bps = 2.0 * (double)bytes / dt;
            if (bps > best) best = bps;
        }
    } else if (started) {
        /* Cannot happen with all threads started; an early failure leaves started workers blocked, so exit. */
        fprintf(stderr, "bench_gemma4: %s\n", berth_last_error());
        exit(1);
    }
    for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&job.go);
    pthread_barrier_destroy(&job.done);
    free(th);
    free(w);
    free(src);
    free(dst);
    *best_bps = best;
    *buf_bytes = bytes;
    return st;
}

/* ---- the runs ---------------------------------------------------------------------------------------------- */

struct run_result {
    double prefill_s;
    double decode_s;
};

static const struct runner_sampling greedy = {.temperature = 0.0f, .top_p = 1.0f};

/* One prefill of the prompt and n_decode decode steps on a fresh sequence, timed separately. */
static berth_status run_once(struct runner *r, const int32_t *prompt, int32_t n_prompt, int32_t n_decode,
                             struct run_result *out)
{
    int32_t seq;
    berth_status st = runner_seq_new(r, &seq);
    if (st) return st;
    double t0 = now_s();
    st = runner_prefill(r, seq, prompt, n_prompt, 0, NULL);
    double t1 = now_s();
    int32_t tok = 0;
    if (!st) st = runner_sample_row(r, runner_n_logits(r) - 1, &greedy, (uint64_t)n_prompt, &tok);
    double t2 = now_s();
    for (int32_t i = 0; i < n_decode && !st; i++) {
        st = runner_decode(r, seq, tok, NULL);
        if (!st) st = runner_sample_row(r, 0, &greedy, (uint64_t)(n_prompt + i + 1), &tok);
    }
    double t3 = now_s();
    runner_seq_free(r, seq);
    out->prefill_s = t1 - t0;
    out->decode_s = t3 - t2;
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median, min and max of v[0..n) (sorts v). */
static void spread(double *v, int n, double *med, double *lo, double *hi)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    *lo = v[0];
    *hi = v[n - 1];
}

/* ---- main -------------------------------------------------------------------------------------------------- */

struct bench_state {
    struct berth_config *cfg;
    struct registry *reg;
    berth_checkpoint *ck;
    struct selection sel;
    int have_sel;
    struct runner *runner;
    int32_t *prompt;
    double *prefill_tps, *decode_tps;
};

/* The order `berth generate` uses: runner, model, checkpoint (weight buffers), backend, plugins, config. */
static void bench_release(struct bench_state *s)
{
    runner_free(s->runner);
    if (s->have_sel && s->sel.model) {
        const berth_model_vtable *mvt = s->sel.model_plugin->desc->vtable;
        mvt->destroy(s->sel.model);
        s->sel.model = NULL;
    }
    ckpt_close(s->ck);
    if (s->have_sel) selection_release(&s->sel);
    registry_free(s->reg);
    config_free(s->cfg);
    free(s->prompt);
    free(s->prefill_tps);
    free(s->decode_tps);
}

static int fail(struct bench_state *s)
{
    fprintf(stderr, "bench_gemma4: error: %s\n", berth_last_error()[0] ? berth_last_error() : "failed");
    bench_release(s);
    return 1;
}

int main(int argc, char **argv)
{
    struct bench_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : 2;
    struct bench_state s;
    memset(&s, 0, sizeof s);

    if (config_load(a.config_path, &s.cfg) != BERTH_OK) return fail(&s);
    if (a.threads > 0 && override_threads(s.cfg, a.threads) != BERTH_OK) return fail(&s);
    if (registry_load(s.cfg, &s.reg) != BERTH_OK) return fail(&s);
    if (ckpt_open(a.model_dir, &s.ck) != BERTH_OK) return fail(&s);
    if (registry_select(s.reg, s.ck, &s.sel) != BERTH_OK) return fail(&s);
    s.have_sel = 1;
    const char *be_name = s.sel.backend_plugin->desc->name;
    if (strcmp(be_name, "cpu") != 0) {
        berth_fail(BERTH_E_UNSUPPORTED, "the selection chose backend '%s'; this benchmark measures the CPU backend "
                   "(set BERTH_BACKEND=cpu or disable the others in %s)", be_name, a.config_path);
        return fail(&s);
    }
    const berth_device_info *dev = s.sel.api.device;
    int n_threads = dev && dev->compute_units > 0 ? dev->compute_units : 1;

    const berth_model_vtable *mvt = s.sel.model_plugin->desc->vtable;
    berth_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (mvt->info(s.sel.model, &info) != BERTH_OK) return fail(&s);

    /* A fixed pseudo-random prompt (ids 3.. avoid pad/eos/bos; the weights are random anyway). */
    s.prompt = malloc((size_t)a.prompt_len * sizeof *s.prompt);
    s.prefill_tps = calloc((size_t)a.repeat, sizeof *s.prefill_tps);
    s.decode_tps = calloc((size_t)a.repeat, sizeof *s.decode_tps);
    if (!s.prompt || !s.prefill_tps || !s.decode_tps) {
        berth_fail(BERTH_E_NOMEM, "out of memory");
        return fail(&s);
    }
    uint32_t x = 12345u;
    for (int32_t i = 0; i < a.prompt_len; i++) {
        x = x * 1664525u + 1013904223u;
        s.prompt[i] = 3 + (int32_t)((x >> 8) % (uint32_t)(info.vocab_size > 3 ? info.vocab_size - 3 : 1));
    }
    if (runner_check_prompt(&info, a.model_dir, s.prompt, a.prompt_len, a.gen_len) != BERTH_OK) return fail(&s);

    uint64_t mat_bytes = 0;
    int32_t n_mats = 0;
    if (decode_matrix_bytes(s.ck, &mat_bytes, &n_mats) != BERTH_OK) return fail(&s);

    ckpt_prefetch(s.ck, NULL, NULL);
    struct runner_config rcfg;
    memset(&rcfg, 0, sizeof rcfg);
    rcfg.be = &s.sel.api;
    rcfg.mvt = mvt;
    rcfg.model = s.sel.model;
    rcfg.ck = s.ck;
    rcfg.model_dir = a.model_dir;
    rcfg.max_batch_tokens = s.cfg->sched_max_batch_tokens;
    rcfg.max_seqs = 1;
    rcfg.kv_block_size = s.cfg->kv_block_size;
    rcfg.kv_memory = s.cfg->kv_memory_bytes;
    if (runner_create(&rcfg, &s.runner) != BERTH_OK) return fail(&s);

    printf("model %s: %s on backend %s (%s), %d threads\n", a.model_dir, s.sel.model_plugin->desc->name, be_name,
           dev ? dev->name : "?", n_threads);
    printf("decode reads %d matrices, %.1f MB per step (checkpoint %.1f MB); prompt %d, gen %d, repeats %d\n",
           (int)n_mats, (double)mat_bytes / 1e6, (double)ckpt_total_bytes(s.ck) / 1e6, (int)a.prompt_len,
           (int)a.gen_len, (int)a.repeat);
    fflush(stdout);

    double bw_before, bw_after;
    size_t bw_buf;
    if (measure_bandwidth(n_threads, &bw_before, &bw_buf) != BERTH_OK) return fail(&s);
    printf("bandwidth before: %.2f GB/s (memcpy, %d threads, 2 x %zu MiB, best of %d, read + written)\n",
           bw_before / 1e9, n_threads, bw_buf >> 20, BW_PASSES);
    fflush(stdout);

    struct run_result res;
    if (run_once(s.runner, s.prompt, a.prompt_len, WARMUP_DECODE_STEPS, &res) != BERTH_OK) return fail(&s);
    printf("warm-up: prefill %.2f s, %d decode steps %.3f s\n", res.prefill_s, WARMUP_DECODE_STEPS, res.decode_s);
    for (int32_t i = 0; i < a.repeat; i++) {
        if (run_once(s.runner, s.prompt, a.prompt_len, a.gen_len, &res) != BERTH_OK) return fail(&s);
        s.prefill_tps[i] = a.prompt_len / res.prefill_s;
        s.decode_tps[i] = a.gen_len / res.decode_s;
        printf("repeat %d: prefill %d tokens in %.3f s = %.1f tok/s; decode %d steps in %.3f s = %.2f tok/s "
               "(%.1f ms/step)\n", (int)i + 1, (int)a.prompt_len, res.prefill_s, s.prefill_tps[i], (int)a.gen_len,
               res.decode_s, s.decode_tps[i], 1e3 * res.decode_s / a.gen_len);
        fflush(stdout);
    }

    if (measure_bandwidth(n_threads, &bw_after, &bw_buf) != BERTH_OK) return fail(&s);
    printf("bandwidth after: %.2f GB/s\n", bw_after / 1e9);
    double bw = bw_before > bw_after ? bw_before : bw_after;
    double floor_tps = bw / (double)mat_bytes;

    double pf_med, pf_lo, pf_hi, dec_med, dec_lo, dec_hi;
    spread(s.prefill_tps, a.repeat, &pf_med, &pf_lo, &pf_hi);
    spread(s.decode_tps, a.repeat, &dec_med, &dec_lo, &dec_hi);

    printf("\n| threads | bandwidth GB/s | bytes/step MB | floor tok/s | decode tok/s | %% of floor "
           "| prefill tok/s |\n");
    printf("|--------:|---------------:|--------------:|------------:|-------------:|-----------:|--------------:|\n");
    printf("| %7d | %14.2f | %13.1f | %11.2f | %12.2f | %9.1f%% | %13.1f |\n", n_threads, bw / 1e9,
           (double)mat_bytes / 1e6, floor_tps, dec_med, 100.0 * dec_med / floor_tps, pf_med);
    if (a.repeat > 1)
        printf("(medians of %d repeats; decode %.2f..%.2f tok/s = %.1f..%.1f%% of floor, prefill %.1f..%.1f tok/s)\n",
               (int)a.repeat, dec_lo, dec_hi, 100.0 * dec_lo / floor_tps, 100.0 * dec_hi / floor_tps, pf_lo, pf_hi);
    fflush(stdout);
    bench_release(&s);
    return 0;
}

/*
 * cmd_bench.c — `berth bench`: serving throughput and latency of the engine (berth.h) at several concurrency
 * levels. At each level C, C requests of --prompt-len random token ids (distinct first tokens, so the prefix
 * cache cannot serve them) and --gen-len new tokens (EOS ignored) are submitted at once (the engine held while
 * they are queued, berth_engine_hold: they start in one step when the batch budget allows); the level reports
 * generated tokens per second over its wall time, time to first token (submission -> first token) and
 * inter-token latency (gaps between a request's consecutive tokens) percentiles.
 *
 * Warm-up (--warmup): `each` (default) runs every level once unmeasured with the same concurrency, prompt length
 * and generation length (other prompts) before measuring it, as the transformers reference is measured ("after a
 * warm-up with the same settings", bench/gpu_gemma4.sh): the first decode steps of a new batch bucket run eagerly
 * and record its CUDA graph (~20 ms at 32 sequences, bench/RESULTS.md session 22), a one-time cost a server pays at
 * its first such batch, not per request. `once`: a single 1-request, 4-token run before the first level only.
 * Output: a table, or with --json one object per level.
 *
 * decode tok/s (JSON "decode_tok_s"): decode throughput with every request of the level past its prefill. The
 * window runs from the level's last first token (the moment the last request finished its prefill) to the
 * level's last token; the count is the tokens, other than a request's first, that arrive inside the window.
 * Tokens that early requests decoded while later prompts were still being prefilled fall outside, so the figure
 * matches a static-batch reference's B*(G-1) / (time(generate G) - time(generate 1)). Tokens delivered in the
 * same engine step as the last first token but after its callback count in (at most concurrency-1 tokens). With
 * --gen-len 1 there is no decode: null in JSON, "-" in the table.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "berth.h"
#include "commands.h"
#include "errors.h"
#include "host_services.h"

static const char bench_usage[] =
    "usage: berth bench --config FILE [--model DIR] [--concurrency 1,4,16,64] [--prompt-len N] [--gen-len M]\n"
    "                   [--seed S] [--warmup each|once] [--json] [--token-gaps]\n"
    "  --concurrency LIST     requests in flight per level, comma separated (default 1,4,16,64)\n"
    "  --prompt-len N         prompt tokens per request (default 128)\n"
    "  --gen-len M            generated tokens per request (default 128)\n"
    "  --seed S               seed of the random prompts (default 0)\n"
    "  --warmup each|once     an unmeasured run of every level's own settings before it (each, default), or one\n"
    "                         short request before the first level (once)\n"
    "  --json                 one JSON object per level\n"
    "  --token-gaps           with --json: \"token_gaps_ms\", the first request's gaps between consecutive tokens\n"
    "                         (one per engine step it took part in: where a slow step falls)\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct bench_req {
    double t_submit, t_first, t_last;
    int32_t n_tok;
    int done;
    berth_status status;
    char message[256];
};

struct level {
    struct bench_req *r;
    int32_t n;
    int64_t first_id;
    double *ttft;   /* [n] */
    double *itl;    /* [n * gen] */
    double *tok_t;  /* [n * gen]: arrival time of request k's token j at k * gen + j */
    int32_t gen;
    int64_t n_itl;
    int32_t n_done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void on_event(void *arg, const berth_engine_event *ev)
{
    struct level *L = arg;
    double t = now_s();
    pthread_mutex_lock(&L->mu);
    int64_t k = ev->request_id - L->first_id;
    if (k >= 0 && k < L->n) {
        struct bench_req *q = &L->r[k];
        if (ev->kind == BERTH_EVENT_TOKEN) {
            if (q->n_tok == 0) {
                L->ttft[k] = t - q->t_submit;
                q->t_first = t;
            } else {
                L->itl[L->n_itl++] = t - q->t_last;
            }
            if (q->n_tok < L->gen) L->tok_t[k * L->gen + q->n_tok] = t;
            q->t_last = t;
            q->n_tok++;
        } else {
            q->done = 1;
            q->status = ev->status;
            snprintf(q->message, sizeof q->message, "%s", ev->message ? ev->message : "");
            L->n_done++;
            pthread_cond_broadcast(&L->cv);
        }
    }
    pthread_mutex_unlock(&L->mu);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, int64_t n, double p)
{
    if (n <= 0) return 0;
    int64_t i = (int64_t)ceil(p / 100.0 * (double)n) - 1;
    if (i < 0) i = 0;
    if (i >= n) i = n - 1;
    return v[i];
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Run C requests at once; fills the level's samples. */
static berth_status run_level(berth_engine *e, int32_t C, int32_t plen, int32_t glen, uint64_t *rng, int64_t tag,
                              struct level *L, double *wall)
{
    int32_t V = berth_engine_vocab_size(e);
    memset(L, 0, sizeof *L);
    pthread_mutex_init(&L->mu, NULL);
    pthread_cond_init(&L->cv, NULL);
    L->n = C;
    L->r = calloc((size_t)C, sizeof *L->r);
    L->ttft = calloc((size_t)C, sizeof *L->ttft);
    L->itl = calloc((size_t)C * (size_t)(glen > 0 ? glen : 1), sizeof *L->itl);
    L->gen = glen > 0 ? glen : 1;
    L->tok_t = calloc((size_t)C * (size_t)L->gen, sizeof *L->tok_t);
    int32_t *ids = malloc((size_t)plen * sizeof *ids);
    if (!L->r || !L->ttft || !L->itl || !L->tok_t || !ids) {
        free(ids);
        return berth_fail(BERTH_E_NOMEM, "bench: out of host memory");
    }
    berth_engine_request rq;
    memset(&rq, 0, sizeof rq);
    rq.struct_size = sizeof rq;
    rq.n_prompt = plen;
    rq.max_new_tokens = glen;
    rq.ignore_eos = 1;
    rq.prompt = ids;
    berth_status st = BERTH_OK;
    double t0 = now_s();
    pthread_mutex_lock(&L->mu); /* events wait until first_id is known */
    /* "At once": held until the last is queued, the level's prompts start in one step, as a static batch does
     * (else the engine's first step takes only those queued by then, and the rest run a step behind: the level's
     * last step decodes only them, in the decode window). */
    berth_engine_hold(e, 1);
    int32_t submitted = 0;
    for (int32_t i = 0; i < C && !st; i++) {
        /* A first token unique to (level, request) keeps the prefix cache out of the measurement. */
        ids[0] = (int32_t)((uint64_t)(tag * 1000 + i) % (uint64_t)V);
        for (int32_t k = 1; k < plen; k++) ids[k] = (int32_t)(splitmix(rng) % (uint64_t)V);
        L->r[i].t_submit = now_s();
        int64_t id;
        st = berth_engine_submit(e, &rq, on_event, L, &id);
        if (!st && i == 0) L->first_id = id;
        if (!st) submitted++;
    }
    berth_engine_hold(e, 0);
    /* Wait for every submitted request, also after a failed submit: their events point into L. */
    while (L->n_done < submitted) pthread_cond_wait(&L->cv, &L->mu);
    if (!st) {
        for (int32_t i = 0; i < C && !st; i++)
            if (L->r[i].status != BERTH_OK) st = berth_fail(L->r[i].status, "bench request failed: %s", L->r[i].message);
    }
    pthread_mutex_unlock(&L->mu);
    *wall = now_s() - t0;
    free(ids);
    return st;
}

static void level_free(struct level *L)
{
    free(L->r);
    free(L->ttft);
    free(L->itl);
    free(L->tok_t);
    pthread_mutex_destroy(&L->mu);
    pthread_cond_destroy(&L->cv);
}

/* Decode tokens per second as defined at the top of this file; -1 when the level has no decode window. */
static double decode_tps(const struct level *L)
{
    double t_lf = 0, t_end = 0;
    for (int32_t k = 0; k < L->n; k++) {
        const struct bench_req *q = &L->r[k];
        if (q->n_tok < 1) return -1;
        if (q->t_first > t_lf) t_lf = q->t_first;
        if (q->t_last > t_end) t_end = q->t_last;
    }
    int64_t n = 0;
    for (int32_t k = 0; k < L->n; k++) {
        int32_t m = L->r[k].n_tok < L->gen ? L->r[k].n_tok : L->gen;
        for (int32_t j = 1; j < m; j++)
            if (L->tok_t[(int64_t)k * L->gen + j] > t_lf) n++;
    }
    return n > 0 && t_end > t_lf ? (double)n / (t_end - t_lf) : -1;
}

static int usage(const char *fmt, const char *arg)
{
    fputs("berth bench: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", bench_usage);
    return 2;
}

static int parse_count(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cmd_bench(int argc, char **argv)
{
    const char *config = NULL, *model = NULL, *conc = "1,4,16,64";
    long long plen = 128, glen = 128, seed = 0;
    int json = 0, warm_each = 1, gaps = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--token-gaps")) {
            gaps = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(bench_usage, stdout);
            return 0;
        }
        if (i + 1 >= argc) return usage("unknown option or missing value: '%s'", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--config"))
            config = v;
        else if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--concurrency"))
            conc = v;
        else if (!strcmp(a, "--prompt-len")) {
            if (parse_count(v, 1, 1 << 24, &plen)) return usage("--prompt-len '%s' is not a positive count", v);
        } else if (!strcmp(a, "--gen-len")) {
            if (parse_count(v, 1, 1 << 24, &glen)) return usage("--gen-len '%s' is not a positive count", v);
        } else if (!strcmp(a, "--warmup")) {
            if (strcmp(v, "each") && strcmp(v, "once")) return usage("--warmup '%s' is not 'each' or 'once'", v);
            warm_each = !strcmp(v, "each");
        } else if (!strcmp(a, "--seed")) {
            if (parse_count(v, 0, LLONG_MAX, &seed)) return usage("--seed '%s' is not a non-negative integer", v);
        } else
            return usage("unknown option '%s'", a);
    }
    if (!config) return usage("%s", "--config FILE is required");
    if (gaps && !json) return usage("%s", "--token-gaps needs --json");
    int32_t levels[32], n_levels = 0, max_c = 1;
    for (const char *p = conc; *p;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 4096 || n_levels == 32 || (*end && *end != ','))
            return usage("--concurrency '%s' is not a comma-separated list of counts in 1..4096", conc);
        levels[n_levels++] = (int32_t)v;
        if (v > max_c) max_c = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    berth_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.config_path = config;
    c.model_dir = model;
    c.queue_capacity = max_c;
    berth_engine *e = NULL;
    if (berth_engine_create(&c, &e) != BERTH_OK) {
        host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
        return 1;
    }
    uint64_t rng = (uint64_t)seed;
    int rc = 0;
    struct level L;
    double wall;
    /* Warm-up: page the weights in, grow buffers (and with --warmup each, below, record each level's graphs). */
    if (!warm_each) {
        if (run_level(e, 1, (int32_t)plen, 4, &rng, 999, &L, &wall) != BERTH_OK) rc = 1;
        level_free(&L);
    }
    if (!json && !rc)
        printf("%-11s %9s %9s %10s %10s %10s %10s %10s %10s %8s %10s\n", "concurrency", "tokens", "tok/s",
               "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90", "itl_p99", "preempt", "decode_t/s");
    for (int32_t li = 0; li < n_levels && !rc; li++) {
        berth_engine_stats s0, s1;
        s0.struct_size = s1.struct_size = sizeof s0;
        if (warm_each) { /* tag 1000 + li: first tokens apart from every measured level's (tag li) */
            if (run_level(e, levels[li], (int32_t)plen, (int32_t)glen, &rng, 1000 + li, &L, &wall) != BERTH_OK) {
                rc = 1;
                level_free(&L);
                break;
            }
            level_free(&L);
        }
        berth_engine_get_stats(e, &s0);
        if (run_level(e, levels[li], (int32_t)plen, (int32_t)glen, &rng, li, &L, &wall) != BERTH_OK) {
            rc = 1;
            level_free(&L);
            break;
        }
        berth_engine_get_stats(e, &s1);
        int64_t tokens = (int64_t)levels[li] * glen;
        qsort(L.ttft, (size_t)L.n, sizeof *L.ttft, cmp_d);
        qsort(L.itl, (size_t)L.n_itl, sizeof *L.itl, cmp_d);
        double tps = (double)tokens / wall;
        double dtps = decode_tps(&L);
        if (json) {
            json_t *o = json_object();
            json_object_set_new(o, "concurrency", json_integer(levels[li]));
            json_object_set_new(o, "prompt_len", json_integer(plen));
            json_object_set_new(o, "gen_len", json_integer(glen));
            json_object_set_new(o, "tokens", json_integer(tokens));
            json_object_set_new(o, "seconds", json_real(wall));
            json_object_set_new(o, "tokens_per_s", json_real(tps));
            json_object_set_new(o, "ttft_p50_s", json_real(pct(L.ttft, L.n, 50)));
            json_object_set_new(o, "ttft_p90_s", json_real(pct(L.ttft, L.n, 90)));
            json_object_set_new(o, "ttft_p99_s", json_real(pct(L.ttft, L.n, 99)));
            json_object_set_new(o, "itl_p50_s", json_real(pct(L.itl, L.n_itl, 50)));
            json_object_set_new(o, "itl_p90_s", json_real(pct(L.itl, L.n_itl, 90)));
            json_object_set_new(o, "itl_p99_s", json_real(pct(L.itl, L.n_itl, 99)));
            json_object_set_new(o, "steps", json_integer(s1.steps - s0.steps));
            json_object_set_new(o, "mixed_steps", json_integer(s1.mixed_steps - s0.mixed_steps));
            json_object_set_new(o, "preemptions", json_integer(s1.preemptions - s0.preemptions));
            json_object_set_new(o, "decode_tok_s", dtps >= 0 ? json_real(dtps) : json_null());
            if (gaps) {
                json_t *g = json_array();
                int32_t m = L.r[0].n_tok < L.gen ? L.r[0].n_tok : L.gen;
                for (int32_t j = 1; j < m; j++)
                    json_array_append_new(g, json_real(1e3 * (L.tok_t[j] - L.tok_t[j - 1])));
                json_object_set_new(o, "token_gaps_ms", g);
            }
            char *js = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
            if (js) printf("%s\n", js);
            free(js);
            json_decref(o);
        } else {
            char dcol[32];
            if (dtps >= 0)
                snprintf(dcol, sizeof dcol, "%.1f", dtps);
            else
                snprintf(dcol, sizeof dcol, "-");
            printf("%-11d %9lld %9.1f %9.1fms %9.1fms %9.1fms %9.1fms %9.1fms %9.1fms %8lld %10s\n", (int)levels[li],
                   (long long)tokens, tps, 1e3 * pct(L.ttft, L.n, 50), 1e3 * pct(L.ttft, L.n, 90),
                   1e3 * pct(L.ttft, L.n, 99), 1e3 * pct(L.itl, L.n_itl, 50), 1e3 * pct(L.itl, L.n_itl, 90),
                   1e3 * pct(L.itl, L.n_itl, 99), (long long)(s1.preemptions - s0.preemptions), dcol);
        }
        fflush(stdout);
        level_free(&L);
    }
    if (rc) host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
    berth_engine_destroy(e);
    return rc;
}

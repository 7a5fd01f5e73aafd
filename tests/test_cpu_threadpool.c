/*
 * test_cpu_threadpool.c — the CPU backend's worker pool (plugins/backend-cpu/threadpool.c, compiled in).
 *
 * Every run must call the task exactly once for each tid in [0, nth) with the clamped nth, tid 0 on the caller,
 * and return only after every call has finished. The stress tests hunt for lost wake-ups and races between
 * runs: many pools of 2..8 threads created and destroyed, thousands of tiny runs with nth < n and nth = n, tasks
 * that sometimes sleep or yield, gaps between runs long enough for the workers to go to sleep, runs straight
 * after create and destroy straight after a run. A run started while another is in progress on the same pool
 * (a task calling cpu_pool_run, or two host threads sharing a pool) must run serially, never hang or drop a
 * call: the pool before this test hung or lost task calls there. A hang is caught by check's per-test timeout.
 * The seed comes from the clock or BERTH_TEST_SEED; BERTH_POOL_STRESS_MS sets each stress test's duration.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "threadpool.h"
#include "check_run.h"

#define MAX_THREADS 8

static uint64_t g_seed;
static long g_stress_ms = 500;

#define CHECK(cond, fmt, ...) ck_assert_msg((cond), "[seed %" PRIu64 "] " fmt, g_seed, ##__VA_ARGS__)

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* What one run records. Workers never call check (not thread-safe): they count, the caller checks. */
struct run_log {
    atomic_int calls[MAX_THREADS + 1];
    atomic_int wrong_nth;   /* a call saw an nth other than the expected one */
    atomic_int wrong_tid;   /* tid outside [0, nth) */
    atomic_int tid0_thread; /* tid 0 ran somewhere other than on the caller */
    int expect_nth;
    pthread_t caller;
    int check_caller; /* tid 0 must run on `caller` */
    int sleepy; /* 0: tasks return at once; else 1 in `sleepy` calls sleeps or yields */
    uint64_t seed;
};

static void log_reset(struct run_log *l, int expect_nth, int sleepy, uint64_t seed)
{
    for (int i = 0; i <= MAX_THREADS; i++)
        atomic_store(&l->calls[i], 0);
    atomic_store(&l->wrong_nth, 0);
    atomic_store(&l->wrong_tid, 0);
    atomic_store(&l->tid0_thread, 0);
    l->expect_nth = expect_nth;
    l->caller = pthread_self();
    l->check_caller = 1;
    l->sleepy = sleepy;
    l->seed = seed;
}

static void log_task(void *ctx, int tid, int nth)
{
    struct run_log *l = ctx;
    if (l->sleepy) {
        uint64_t s = l->seed ^ ((uint64_t)(tid + 1) * 0x9e3779b97f4a7c15ull);
        const uint64_t r = rng(&s) % (uint64_t)(4 * l->sleepy);
        if (r == 0)
            sleep_us((long)(rng(&s) % 60));
        else if (r == 1)
            sched_yield();
    }
    if (nth != l->expect_nth)
        atomic_fetch_add(&l->wrong_nth, 1);
    if (tid < 0 || tid >= nth || tid > MAX_THREADS) {
        atomic_fetch_add(&l->wrong_tid, 1);
        return;
    }
    if (tid == 0 && l->check_caller && !pthread_equal(pthread_self(), l->caller))
        atomic_fetch_add(&l->tid0_thread, 1);
    /* Counted last: cpu_pool_run must not return before this store, even after a sleep. */
    atomic_fetch_add(&l->calls[tid], 1);
}

/* Check one finished run: each tid in [0, nth) called once, nothing else. */
static void log_check(struct run_log *l, int n, int asked, long run)
{
    const int nth = l->expect_nth;
    CHECK(atomic_load(&l->wrong_nth) == 0, "pool of %d, run %ld, nth %d asked: a call saw nth != %d", n, run,
          asked, nth);
    CHECK(atomic_load(&l->wrong_tid) == 0, "pool of %d, run %ld, nth %d: a call got a tid outside [0, %d)", n, run,
          asked, nth);
    CHECK(atomic_load(&l->tid0_thread) == 0, "pool of %d, run %ld: tid 0 did not run on the caller", n, run);
    for (int t = 0; t <= MAX_THREADS; t++) {
        const int got = atomic_load(&l->calls[t]), want = t < nth ? 1 : 0;
        CHECK(got == want, "pool of %d, run %ld, nth %d asked (%d expected): tid %d called %d times, want %d", n,
              run, asked, nth, t, got, want);
    }
}

static int clamp_nth(int asked, int n) { return asked > n ? n : asked < 1 ? 1 : asked; }

/* One pool of n: `runs` runs with random nth in [1, n + 1] (n + 1 is clamped); every `gap_every`-th run is
 * preceded by a pause long enough for the workers to stop spinning and block. */
static void stress_pool(int n, long runs, int sleepy, long gap_every, uint64_t *s)
{
    struct cpu_pool *p = NULL;
    CHECK(cpu_pool_create(n, &p) == 0 && p, "cpu_pool_create(%d) failed", n);
    struct run_log *l = malloc(sizeof *l);
    for (long r = 0; r < runs; r++) {
        if (gap_every && rng(s) % (uint64_t)gap_every == 0)
            sleep_us(200 + (long)(rng(s) % 800));
        const int asked = 1 + (int)(rng(s) % (uint64_t)(n + 1));
        log_reset(l, clamp_nth(asked, n), sleepy, rng(s));
        cpu_pool_run(p, asked, log_task, l);
        log_check(l, n, asked, r);
    }
    free(l);
    cpu_pool_destroy(p);
}

/* ---- behaviour ---- */

START_TEST(test_create_rejects_zero_threads)
{
    struct cpu_pool *p = NULL;
    ck_assert_int_eq(cpu_pool_create(0, &p), EINVAL);
    ck_assert_ptr_null(p);
    ck_assert_int_eq(cpu_pool_create(-3, &p), EINVAL);
    ck_assert_ptr_null(p);
    cpu_pool_destroy(NULL); /* accepted */
}
END_TEST

START_TEST(test_every_tid_once)
{
    struct run_log *l = malloc(sizeof *l);
    for (int n = 1; n <= MAX_THREADS; n++) {
        struct cpu_pool *p = NULL;
        ck_assert_int_eq(cpu_pool_create(n, &p), 0);
        for (int asked = 1; asked <= n + 2; asked++) {
            log_reset(l, clamp_nth(asked, n), 0, 0);
            cpu_pool_run(p, asked, log_task, l);
            log_check(l, n, asked, asked);
        }
        cpu_pool_destroy(p);
    }
    free(l);
}
END_TEST

/* A slow worker: the run must wait for it, and the next run must still reach every worker. */
struct slow_ctx {
    atomic_int finished;
    int slow_tid;
};

static void slow_task(void *ctx, int tid, int nth)
{
    struct slow_ctx *c = ctx;
    (void)nth;
    if (tid == c->slow_tid)
        sleep_us(20000);
    atomic_fetch_add(&c->finished, 1);
}

START_TEST(test_run_waits_for_slow_worker)
{
    struct cpu_pool *p = NULL;
    ck_assert_int_eq(cpu_pool_create(4, &p), 0);
    for (int slow = 0; slow < 4; slow++) {
        struct slow_ctx c = {.slow_tid = slow};
        atomic_init(&c.finished, 0);
        cpu_pool_run(p, 4, slow_task, &c);
        ck_assert_int_eq(atomic_load(&c.finished), 4);
    }
    cpu_pool_destroy(p);
}
END_TEST

/* ---- stress ---- */

/* Pools of 2..8 created, run a few hundred times with no pauses, destroyed; until the time budget is spent. */
START_TEST(test_stress_tiny_runs)
{
    uint64_t s = g_seed | 1;
    const double end = now_ms() + (double)g_stress_ms;
    long pools = 0;
    do {
        const int n = 2 + (int)(pools % (MAX_THREADS - 1));
        stress_pool(n, 50 + (long)(rng(&s) % 400), 0, 0, &s);
        pools++;
    } while (now_ms() < end || pools < MAX_THREADS - 1);
}
END_TEST

/* The same with tasks that sleep or yield now and then, and pauses that put the workers to sleep. */
START_TEST(test_stress_sleepy_runs)
{
    uint64_t s = (g_seed ^ 0x5bd1e995u) | 1;
    const double end = now_ms() + (double)g_stress_ms;
    long pools = 0;
    do {
        const int n = 2 + (int)(pools % (MAX_THREADS - 1));
        stress_pool(n, 20 + (long)(rng(&s) % 100), 4, 16, &s);
        pools++;
    } while (now_ms() < end || pools < MAX_THREADS - 1);
}
END_TEST

/* Create/destroy interleavings: destroy before the workers have even started, a run straight after create
 * (workers possibly not yet running), destroy straight after a run (workers possibly still spinning). */
START_TEST(test_create_destroy_churn)
{
    uint64_t s = (g_seed ^ 0xc2b2ae35u) | 1;
    struct run_log *l = malloc(sizeof *l);
    const double end = now_ms() + (double)g_stress_ms / 2;
    long i = 0;
    do {
        const int n = 2 + (int)(i % (MAX_THREADS - 1));
        struct cpu_pool *p = NULL;
        CHECK(cpu_pool_create(n, &p) == 0, "cpu_pool_create(%d) failed", n);
        const long runs = (long)(rng(&s) % 3);
        for (long r = 0; r < runs; r++) {
            const int asked = r == 0 ? n : 1 + (int)(rng(&s) % (uint64_t)n);
            log_reset(l, asked, 0, 0);
            cpu_pool_run(p, asked, log_task, l);
            log_check(l, n, asked, r);
        }
        cpu_pool_destroy(p);
        i++;
    } while (now_ms() < end);
    free(l);
}
END_TEST

/* Two host threads, each with its own pools, at the same time. */
struct host_thread_arg {
    uint64_t seed;
    double end;
    int failed_at; /* 0: fine; else the pool count at the first bad run */
};

static void *host_thread_main(void *arg)
{
    struct host_thread_arg *a = arg;
    uint64_t s = a->seed | 1;
    struct run_log *l = malloc(sizeof *l);
    long pools = 0;
    do {
        const int n = 2 + (int)(rng(&s) % (MAX_THREADS - 1));
        struct cpu_pool *p = NULL;
        if (cpu_pool_create(n, &p) != 0) {
            a->failed_at = -1;
            break;
        }
        for (long r = 0; r < 100 && !a->failed_at; r++) {
            const int asked = 1 + (int)(rng(&s) % (uint64_t)n);
            log_reset(l, asked, 8, rng(&s));
            cpu_pool_run(p, asked, log_task, l);
            for (int t = 0; t <= MAX_THREADS; t++)
                if (atomic_load(&l->calls[t]) != (t < asked) || atomic_load(&l->wrong_nth))
                    a->failed_at = (int)pools + 1;
        }
        cpu_pool_destroy(p);
        pools++;
    } while (!a->failed_at && now_ms() < a->end);
    free(l);
    return NULL;
}

START_TEST(test_two_host_threads_own_pools)
{
    struct host_thread_arg a[2] = {{.seed = g_seed * 3}, {.seed = g_seed * 5}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        a[i].end = now_ms() + (double)g_stress_ms / 2;
        ck_assert_int_eq(pthread_create(&th[i], NULL, host_thread_main, &a[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        CHECK(a[i].failed_at == 0, "host thread %d: a run went wrong in pool %d", i, a[i].failed_at);
}
END_TEST

/* ---- misuse: a run while another is in progress (threadpool.h: it runs serially on its own thread) ---- */

/* A run whose task calls cpu_pool_run again from tid `nester`: the inner run must execute once, as tid 0 of 1,
 * and the outer run must still reach every tid once. */
struct nest_ctx {
    struct cpu_pool *pool;
    int nester;
    struct run_log outer, inner;
};

static void nest_task(void *ctx, int tid, int nth)
{
    struct nest_ctx *c = ctx;
    if (tid == c->nester)
        cpu_pool_run(c->pool, nth, log_task, &c->inner);
    log_task(&c->outer, tid, nth);
}

START_TEST(test_nested_run_is_serial)
{
    const int n = 4;
    struct cpu_pool *p = NULL;
    ck_assert_int_eq(cpu_pool_create(n, &p), 0);
    struct nest_ctx *c = malloc(sizeof *c);
    c->pool = p;
    for (int nester = 0; nester < n; nester++)
        for (int r = 0; r < 200; r++) {
            c->nester = nester;
            log_reset(&c->outer, n, 0, 0);
            log_reset(&c->inner, 1, 0, 0);
            c->inner.check_caller = nester == 0; /* else it runs on the nesting worker */
            cpu_pool_run(p, n, nest_task, c);
            log_check(&c->outer, n, n, r);
            log_check(&c->inner, n, n, r);
        }
    free(c);
    cpu_pool_destroy(p);
}
END_TEST

/* Two host threads running on one pool at once: each run must either use the pool (every tid < asked once)
 * or run serially (tid 0 of 1 once); never lose or repeat a call, never hang. */
struct shared_log {
    atomic_int calls[MAX_THREADS + 1];
    atomic_int nth_seen; /* 0 until the first call */
    atomic_int mixed;    /* calls of one run disagreed on nth */
};

static void shared_task(void *ctx, int tid, int nth)
{
    struct shared_log *l = ctx;
    int none = 0;
    if (!atomic_compare_exchange_strong(&l->nth_seen, &none, nth) && none != nth)
        atomic_fetch_add(&l->mixed, 1);
    if (tid >= 0 && tid <= MAX_THREADS)
        atomic_fetch_add(&l->calls[tid], 1);
    if ((tid & 1) && nth > 2)
        sched_yield();
}

struct shared_arg {
    struct cpu_pool *pool;
    int n;
    uint64_t seed;
    long runs;
    long parallel, serial; /* how the runs went */
    char error[160];
};

static void *shared_main(void *arg)
{
    struct shared_arg *a = arg;
    uint64_t s = a->seed | 1;
    struct shared_log *l = malloc(sizeof *l);
    for (long r = 0; r < a->runs && !a->error[0]; r++) {
        const int asked = 2 + (int)(rng(&s) % (uint64_t)(a->n - 1));
        for (int t = 0; t <= MAX_THREADS; t++)
            atomic_store(&l->calls[t], 0);
        atomic_store(&l->nth_seen, 0);
        atomic_store(&l->mixed, 0);
        cpu_pool_run(a->pool, asked, shared_task, l);
        const int nth = atomic_load(&l->nth_seen);
        if (nth != asked && nth != 1)
            snprintf(a->error, sizeof a->error, "run %ld, nth %d asked: the task saw nth %d", r, asked, nth);
        if (atomic_load(&l->mixed))
            snprintf(a->error, sizeof a->error, "run %ld: calls of one run saw different nth", r);
        for (int t = 0; t <= MAX_THREADS; t++)
            if (atomic_load(&l->calls[t]) != (t < nth ? 1 : 0))
                snprintf(a->error, sizeof a->error, "run %ld, nth %d: tid %d called %d times", r, nth, t,
                         atomic_load(&l->calls[t]));
        if (nth == 1)
            a->serial++;
        else
            a->parallel++;
    }
    free(l);
    return NULL;
}

START_TEST(test_two_host_threads_share_a_pool)
{
    const int n = 4;
    struct cpu_pool *p = NULL;
    ck_assert_int_eq(cpu_pool_create(n, &p), 0);
    struct shared_arg a[2] = {{.pool = p, .n = n, .seed = g_seed * 7, .runs = 3000},
                              {.pool = p, .n = n, .seed = g_seed * 11, .runs = 3000}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, shared_main, &a[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        CHECK(!a[i].error[0], "host thread %d: %s", i, a[i].error);
    /* Every run went one way or the other, and some used the workers. */
    ck_assert_int_eq(a[0].parallel + a[0].serial + a[1].parallel + a[1].serial, 6000);
    ck_assert_int_gt(a[0].parallel + a[1].parallel, 0);
    cpu_pool_destroy(p);
}
END_TEST

int main(void)
{
    const char *env = getenv("BERTH_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    const char *ms = getenv("BERTH_POOL_STRESS_MS");
    if (ms && atol(ms) > 0)
        g_stress_ms = atol(ms);
    printf("cpu_threadpool: seed %" PRIu64 " (set BERTH_TEST_SEED to repeat), %ld ms per stress test\n", g_seed,
           g_stress_ms);
    Suite *su = suite_create("cpu_threadpool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 30); /* a hang fails the test instead of stalling the suite */
    tcase_add_test(tc, test_create_rejects_zero_threads);
    tcase_add_test(tc, test_every_tid_once);
    tcase_add_test(tc, test_run_waits_for_slow_worker);
    tcase_add_test(tc, test_stress_tiny_runs);
    tcase_add_test(tc, test_stress_sleepy_runs);
    tcase_add_test(tc, test_create_destroy_churn);
    tcase_add_test(tc, test_two_host_threads_own_pools);
    tcase_add_test(tc, test_nested_run_is_serial);
    tcase_add_test(tc, test_two_host_threads_share_a_pool);
    suite_add_tcase(su, tc);
    return check_run(su, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

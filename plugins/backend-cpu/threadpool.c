/* threadpool.c — see threadpool.h.
 *
 * The protocol: one mutex, two condition variables and a generation counter.
 *  - A run writes fn/ctx/nth and pending = n-1, then bumps gen under mu (release) and broadcasts wake.
 *  - A worker waits for gen to move past the last generation it served: it spins on gen first, then re-checks
 *    it under mu before every wait, and since gen only moves under mu the bump cannot fall between its check and
 *    its wait. It runs its share (tid >= nth runs nothing), then decrements pending; the worker that brings
 *    pending to 0 signals done under mu, so the caller cannot miss it between its own check and wait either.
 *  - The caller runs tid 0, then waits for pending == 0 the same way (spin, then check-and-wait under mu).
 * Every worker counts in every generation, so gen cannot move on while one is still reading fn/ctx/nth, and a
 * worker never skips a generation. Stop is one more generation, with stop set.
 * A run that finds the pool busy (nested in a task, or from a second host thread) would break all of this —
 * rewriting pending and the task under the running generation — so it runs serially instead (threadpool.h).
 */
#include "threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

/* Pause iterations a worker (or the caller) spins before blocking: long enough to bridge the gap between two
 * consecutive ops of a decode step, short enough not to burn a core while the host does other work. */
#define CPU_POOL_SPIN 4000

struct cpu_worker {
    struct cpu_pool *pool;
    int tid;
    uint_fast64_t start_gen; /* gen when the pool was made: a run or stop posted before the thread ran counts */
};

struct cpu_pool {
    int n;                      /* threads including the caller */
    pthread_t *threads;         /* n-1 */
    struct cpu_worker *workers; /* n-1 */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* gen moved (a run or stop) */
    pthread_cond_t done; /* pending reached 0 */
    atomic_uint_fast64_t gen; /* changed under mu only; read without it while spinning */
    atomic_int pending;       /* workers that have not finished generation gen */
    atomic_int busy;          /* a run is in progress */
    /* Written before gen is bumped (release), read after the new gen is seen (acquire). */
    int stop;
    cpu_task_fn fn;
    void *ctx;
    int nth;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Block until gen differs from seen; returns the new gen. */
static uint_fast64_t wait_new_gen(struct cpu_pool *p, uint_fast64_t seen)
{
    for (int i = 0; i < CPU_POOL_SPIN; i++) {
        const uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    uint_fast64_t g;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
        pthread_cond_wait(&p->wake, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return g;
}

/* Block until every worker has finished the current generation. */
static void wait_pending(struct cpu_pool *p)
{
    for (int i = 0; i < CPU_POOL_SPIN; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void *worker_main(void *arg)
{
    const struct cpu_worker *w = arg;
    struct cpu_pool *p = w->pool;
    uint_fast64_t seen = w->start_gen;
    for (;;) {
        seen = wait_new_gen(p, seen);
        if (p->stop)
            return NULL;
        const int nth = p->nth;
        if (w->tid < nth)
            p->fn(p->ctx, w->tid, nth);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void pool_release(struct cpu_pool *p, int started)
{
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p->threads);
    free(p);
}

int cpu_pool_create(int n_threads, struct cpu_pool **out)
{
    if (n_threads < 1)
        return EINVAL;
    struct cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return ENOMEM;
    p->n = n_threads;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->threads || !p->workers) {
        free(p->threads);
        free(p->workers);
        free(p);
        return ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->busy, 0);
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].tid = i + 1;
        p->workers[i].start_gen = atomic_load_explicit(&p->gen, memory_order_relaxed);
        const int err = pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]);
        if (err) {
            pool_release(p, i);
            return err;
        }
    }
    *out = p;
    return 0;
}

void cpu_pool_destroy(struct cpu_pool *p)
{
    if (p)
        pool_release(p, p->n - 1);
}

void cpu_pool_run(struct cpu_pool *p, int nth, cpu_task_fn fn, void *ctx)
{
    if (nth > p->n)
        nth = p->n;
    if (nth <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    if (atomic_exchange_explicit(&p->busy, 1, memory_order_acquire)) {
        fn(ctx, 0, 1); /* nested or concurrent run: serially, on this thread (threadpool.h) */
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->nth = nth;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, nth);

    wait_pending(p);
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

/* threadpool.c — see threadpool.h. */
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
};

struct cpu_pool {
    int n;                      /* threads including the caller */
    pthread_t *threads;         /* n-1 */
    struct cpu_worker *workers; /* n-1 */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* new generation or stop */
    pthread_cond_t done; /* remaining reached 0 */
    atomic_uint_fast64_t gen;
    atomic_int remaining;
    atomic_int stop;
    /* The current task; written before gen is bumped (release), read after it is seen (acquire). */
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

static void *worker_main(void *arg)
{
    const struct cpu_worker *w = arg;
    struct cpu_pool *p = w->pool;
    uint_fast64_t seen = 0; /* the generation at creation: a task or stop posted before this thread ran counts */
    for (;;) {
        for (int i = 0; i < CPU_POOL_SPIN && atomic_load_explicit(&p->gen, memory_order_acquire) == seen; i++)
            cpu_relax();
        if (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen)
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        if (w->tid < p->nth)
            p->fn(p->ctx, w->tid, p->nth);
        if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void pool_release(struct cpu_pool *p, int started)
{
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
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
    atomic_init(&p->remaining, 0);
    atomic_init(&p->stop, 0);
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].tid = i + 1;
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
    p->fn = fn;
    p->ctx = ctx;
    p->nth = nth;
    atomic_store_explicit(&p->remaining, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    fn(ctx, 0, nth);

    for (int i = 0; i < CPU_POOL_SPIN && atomic_load_explicit(&p->remaining, memory_order_acquire) > 0; i++)
        cpu_relax();
    if (atomic_load_explicit(&p->remaining, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->remaining, memory_order_acquire) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

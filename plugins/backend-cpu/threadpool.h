/*
 * threadpool.h — a fixed pool of worker threads that run one parallel task at a time.
 *
 * The calling thread is worker 0 and takes part, so a pool of n threads starts n-1 pthreads. cpu_pool_run()
 * returns when every worker has finished the task. Workers spin briefly after a task (ops come in quick
 * succession during a forward step) and then sleep on a condition variable, so an idle backend costs nothing.
 *
 * One run at a time: the backend serialises ops (exec_mu) and no task calls back into the pool. A run that
 * starts while another is in progress on the same pool — a task calling cpu_pool_run (nested), or a second host
 * thread — does not touch the pool: it runs fn(ctx, 0, 1) on its own thread and returns. That keeps misuse
 * from deadlocking or dropping task calls, but such a run shares tid 0 with the run in progress, so anything
 * indexed by tid (the backend's per-thread scratch) is not private to it: callers must not rely on it.
 */
#ifndef CPU_THREADPOOL_H
#define CPU_THREADPOOL_H

/* The task: called once per worker with its id in [0, nth). */
typedef void (*cpu_task_fn)(void *ctx, int tid, int nth);

struct cpu_pool;

/* Start a pool of n_threads (>= 1, including the caller). Returns 0, or an errno value (caller owns *out, which
 * is left untouched on error). */
int cpu_pool_create(int n_threads, struct cpu_pool **out);
/* Stop and join the workers, free the pool. Accepts NULL. Not while a run is in progress. */
void cpu_pool_destroy(struct cpu_pool *p);
/* Run fn on nth workers (nth < 1 is 1; larger than the pool is clamped); fn(ctx, 0, nth) runs on the caller. */
void cpu_pool_run(struct cpu_pool *p, int nth, cpu_task_fn fn, void *ctx);

#endif

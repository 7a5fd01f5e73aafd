/* engine.c — the serving engine of berth.h: loads a checkpoint, runs the scheduler on its own thread, takes
 * submissions through a bounded queue, streams events. */
#include "berth.h"

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "registry.h"
#include "runner.h"
#include "scheduler.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A submitted request until its last sample is done. */
struct live {
    int64_t id;
    berth_engine_event_fn cb;
    void *arg;
    int32_t samples_left;
    int added;                 /* handed to the scheduler */
    struct sched_request rq;   /* owned copies of prompt / stop ids until added */
};

struct berth_engine {
    struct berth_config *cfg;
    struct registry *reg;
    berth_checkpoint *ck;
    struct selection sel;
    int have_sel;
    struct runner *runner;
    struct scheduler *sched;
    berth_model_info info;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    struct live *live;         /* [capacity]; n_live used, in submission order */
    int32_t n_live, capacity;
    int64_t *cancels;          /* [capacity] ids to cancel before the next step */
    int32_t n_cancels;
    int64_t next_id;
    int64_t rejected;
    berth_engine_stats snap;
};

const char *berth_engine_last_error(void) { return berth_last_error(); }
int32_t berth_engine_vocab_size(const berth_engine *e) { return e->info.vocab_size; }
int32_t berth_engine_max_positions(const berth_engine *e) { return e->info.max_positions; }

/* Index of id in live[], or -1. Under mu. */
static int32_t live_find(const berth_engine *e, int64_t id)
{
    for (int32_t i = 0; i < e->n_live; i++)
        if (e->live[i].id == id) return i;
    return -1;
}

static void live_drop(berth_engine *e, int32_t i)
{
    free((void *)e->live[i].rq.prompt);
    free((void *)e->live[i].rq.stop_ids);
    memmove(e->live + i, e->live + i + 1, (size_t)(e->n_live - i - 1) * sizeof *e->live);
    e->n_live--;
}

static void snapshot(berth_engine *e);

static void on_token(void *arg, int64_t id, int32_t index, int32_t token)
{
    berth_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    snapshot(e); /* so a token's observer sees the KV the step took */
    int32_t i = live_find(e, id);
    berth_engine_event_fn cb = i >= 0 ? e->live[i].cb : NULL;
    void *cb_arg = i >= 0 ? e->live[i].arg : NULL;
    pthread_mutex_unlock(&e->mu);
    if (!cb) return;
    berth_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = BERTH_EVENT_TOKEN;
    ev.index = index;
    ev.request_id = id;
    ev.token = token;
    cb(cb_arg, &ev);
}

static void on_done(void *arg, int64_t id, int32_t index, const char *finish, int32_t n_tokens, int32_t cached,
                    berth_status st, const char *msg)
{
    berth_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    /* The request's KV is already freed: DONE observers see it in the stats. */
    if (e->thread_started) snapshot(e);
    int32_t i = live_find(e, id);
    berth_engine_event_fn cb = i >= 0 ? e->live[i].cb : NULL;
    void *cb_arg = i >= 0 ? e->live[i].arg : NULL;
    /* Its queue slot frees before the last DONE is delivered: whoever waits for DONE then finds room. */
    if (i >= 0 && --e->live[i].samples_left <= 0) live_drop(e, i);
    pthread_mutex_unlock(&e->mu);
    if (!cb) return;
    berth_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = BERTH_EVENT_DONE;
    ev.index = index;
    ev.request_id = id;
    ev.n_tokens = n_tokens;
    ev.cached_tokens = cached;
    ev.status = st;
    ev.finish_reason = finish;
    ev.message = msg ? msg : "";
    cb(cb_arg, &ev);
}

/* Refresh the stats snapshot. Engine thread, under mu. */
static void snapshot(berth_engine *e)
{
    const struct sched_stats *s = sched_stats(e->sched);
    berth_engine_stats *o = &e->snap;
    o->struct_size = sizeof *o;
    o->running = s->running;
    o->waiting = s->waiting;
    for (int32_t i = 0; i < e->n_live; i++)
        if (!e->live[i].added) o->waiting++;
    o->steps = s->steps;
    o->prefill_tokens = s->prefill_tokens;
    o->cached_tokens = s->cached_tokens;
    o->decode_rows = s->decode_rows;
    o->mixed_steps = s->mixed_steps;
    o->preemptions = s->preemptions;
    o->forks = s->forks;
    o->finished = s->finished;
    o->cancelled = s->cancelled;
    o->failed = s->failed;
    o->rejected = e->rejected;
    struct kv_cache *kv = runner_kv(e->runner);
    o->n_pools = kv_n_groups(kv);
    for (int32_t g = 0; g < o->n_pools && g < 8; g++) {
        o->blocks_in_use[g] = kv_blocks_in_use(kv, g);
        o->blocks_cached[g] = kv_blocks_cached(kv, g);
        o->blocks_total[g] = kv_blocks_total(kv, g);
        snprintf(o->pool_names[g], sizeof o->pool_names[g], "%s", kv_group_name(kv, g));
    }
}

static void *engine_main(void *arg)
{
    berth_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        int has_new = 0;
        for (int32_t i = 0; i < e->n_live && !has_new; i++) has_new = !e->live[i].added;
        while (!e->stop && !has_new && e->n_cancels == 0 && sched_pending(e->sched) == 0) {
            pthread_cond_wait(&e->cv, &e->mu);
            for (int32_t i = 0; i < e->n_live && !has_new; i++) has_new = !e->live[i].added;
        }
        if (e->stop) break;
        /* New submissions, in order. The scheduler copies what it keeps. */
        for (int32_t i = 0; i < e->n_live; i++) {
            struct live *l = &e->live[i];
            if (l->added) continue;
            l->added = 1;
            int64_t id = l->id;
            struct sched_request rq = l->rq;
            pthread_mutex_unlock(&e->mu);
            berth_status st = sched_add(e->sched, id, &rq);
            if (st) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", berth_last_error());
                int32_t n = rq.n > 0 ? rq.n : 1;
                for (int32_t k = 0; k < n; k++) on_done(e, id, k, SCHED_FINISH_ERROR, 0, 0, st, msg);
            }
            pthread_mutex_lock(&e->mu);
            i = -1; /* the array may have shifted: rescan (added entries are skipped) */
        }
        while (e->n_cancels > 0) {
            int64_t id = e->cancels[--e->n_cancels];
            pthread_mutex_unlock(&e->mu);
            sched_cancel(e->sched, id); /* may already have finished: fine */
            pthread_mutex_lock(&e->mu);
        }
        snapshot(e);
        if (sched_pending(e->sched) > 0) {
            pthread_mutex_unlock(&e->mu);
            int did = 0;
            sched_step(e->sched, &did);
            pthread_mutex_lock(&e->mu);
            snapshot(e);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static void engine_release(berth_engine *e)
{
    sched_free(e->sched);
    runner_free(e->runner);
    /* model -> checkpoint -> backend, as cmd_generate. */
    if (e->have_sel && e->sel.model) selection_destroy_model(&e->sel);
    ckpt_close(e->ck);
    if (e->have_sel) selection_release(&e->sel);
    registry_free(e->reg);
    config_free(e->cfg);
    if (e->live)
        for (int32_t i = 0; i < e->n_live; i++) {
            free((void *)e->live[i].rq.prompt);
            free((void *)e->live[i].rq.stop_ids);
        }
    free(e->live);
    free(e->cancels);
}

berth_status berth_engine_create(const berth_engine_config *c, berth_engine **out)
{
    *out = NULL;
    if (!c || !c->config_path) return berth_fail(BERTH_E_INVALID, "engine: a config path is required");
    berth_engine *e = calloc(1, sizeof *e);
    if (!e) return berth_fail(BERTH_E_NOMEM, "engine: out of host memory");
    berth_status st;
    if ((st = config_load(c->config_path, &e->cfg))) goto fail;
    const char *dir = c->model_dir ? c->model_dir : e->cfg->model_path;
    if (!dir) {
        st = berth_fail(BERTH_E_INVALID, "%s: no model folder (give one, or set [model] path)", c->config_path);
        goto fail;
    }
    if ((st = registry_load(e->cfg, &e->reg))) goto fail;
    if ((st = ckpt_open(dir, &e->ck))) goto fail;
    if ((st = registry_select(e->reg, e->ck, &e->sel))) goto fail;
    e->have_sel = 1;
    uint64_t kv_memory = c->kv_memory ? c->kv_memory : e->cfg->kv_memory_bytes;
    const berth_device_info *dev = e->sel.api.device;
    if (dev && dev->total_memory > 0) {
        char what[256];
        snprintf(what, sizeof what, "backend '%s' (%s)", e->sel.backend_plugin->desc->name, dev->name);
        if ((st = ckpt_check_fits(e->ck, dev->total_memory, what))) goto fail;
        uint64_t w = ckpt_total_bytes(e->ck);
        if (w + kv_memory > dev->total_memory) {
            st = berth_fail(BERTH_E_DEVICE_OOM,
                            "[kv] memory = %llu bytes does not fit beside the weights (%llu bytes) on %s (%llu "
                            "bytes): lower [kv] memory to at most %llu",
                            (unsigned long long)kv_memory, (unsigned long long)w, what,
                            (unsigned long long)dev->total_memory, (unsigned long long)(dev->total_memory - w));
            goto fail;
        }
    }
    struct runner_config rc;
    memset(&rc, 0, sizeof rc);
    rc.be = &e->sel.api;
    rc.mvt = e->sel.model_plugin->desc->vtable;
    rc.model = e->sel.model;
    rc.ck = e->ck;
    rc.model_dir = dir;
    rc.max_batch_tokens = c->max_batch_tokens > 0 ? c->max_batch_tokens : e->cfg->sched_max_batch_tokens;
    rc.max_seqs = c->max_seqs > 0 ? c->max_seqs : e->cfg->sched_max_seqs;
    rc.kv_block_size = e->cfg->kv_block_size;
    rc.kv_memory = kv_memory;
    rc.state_snapshots = 2 * rc.max_seqs;
    if ((st = runner_create(&rc, &e->runner))) goto fail;
    e->info = *runner_info(e->runner);
    struct sched_callbacks cb = {on_token, on_done, e};
    if ((st = sched_create(e->runner, &cb, &e->sched))) goto fail;
    e->capacity = c->queue_capacity > 0 ? c->queue_capacity : 4 * rc.max_seqs;
    e->live = calloc((size_t)e->capacity, sizeof *e->live);
    e->cancels = calloc((size_t)e->capacity, sizeof *e->cancels);
    if (!e->live || !e->cancels) {
        st = berth_fail(BERTH_E_NOMEM, "engine: out of host memory");
        goto fail;
    }
    e->next_id = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    snapshot(e);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        st = berth_fail(BERTH_E_INTERNAL, "engine: cannot start its thread");
        goto fail;
    }
    e->thread_started = 1;
    *out = e;
    return BERTH_OK;
fail:
    engine_release(e);
    free(e);
    return st;
}

void berth_engine_destroy(berth_engine *e)
{
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        /* Everything still live finishes "cancelled" (requests never added get their DONE here too). */
        for (;;) {
            pthread_mutex_lock(&e->mu);
            int32_t n = e->n_live;
            struct live l = n > 0 ? e->live[0] : (struct live){0};
            pthread_mutex_unlock(&e->mu);
            if (n == 0) break;
            if (l.added && sched_cancel(e->sched, l.id) == BERTH_OK) continue;
            int32_t samples = l.samples_left;
            for (int32_t k = 0; k < samples; k++)
                on_done(e, l.id, k, SCHED_FINISH_CANCEL, 0, 0, BERTH_OK, "");
        }
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
    }
    engine_release(e);
    free(e);
}

berth_status berth_engine_submit(berth_engine *e, const berth_engine_request *rq, berth_engine_event_fn cb,
                                 void *arg, int64_t *id)
{
    if (id) *id = -1;
    if (!rq || !cb) return berth_fail(BERTH_E_INVALID, "engine: submit needs a request and a callback");
    if (!rq->prompt && rq->n_prompt > 0) return berth_fail(BERTH_E_INVALID, "engine: the prompt is NULL");
    berth_status st = runner_check_prompt(&e->info, NULL, rq->prompt, rq->n_prompt, rq->max_new_tokens);
    if (st) return st;
    int32_t n = rq->n > 0 ? rq->n : 1;
    if (n > runner_max_seqs(e->runner))
        return berth_fail(BERTH_E_INVALID, "n = %d samples exceed [scheduler] max_seqs = %d", (int)n,
                          (int)runner_max_seqs(e->runner));
    if (rq->n_stop_ids < 0 || (rq->n_stop_ids > 0 && !rq->stop_ids))
        return berth_fail(BERTH_E_INVALID, "engine: bad stop id list (%d ids)", (int)rq->n_stop_ids);
    int32_t *prompt = malloc((size_t)rq->n_prompt * sizeof *prompt);
    int32_t *stop = malloc((size_t)(rq->n_stop_ids > 0 ? rq->n_stop_ids : 1) * sizeof *stop);
    if (!prompt || !stop) {
        free(prompt);
        free(stop);
        return berth_fail(BERTH_E_NOMEM, "engine: out of host memory");
    }
    memcpy(prompt, rq->prompt, (size_t)rq->n_prompt * sizeof *prompt);
    if (rq->n_stop_ids > 0) memcpy(stop, rq->stop_ids, (size_t)rq->n_stop_ids * sizeof *stop);
    pthread_mutex_lock(&e->mu);
    if (e->n_live >= e->capacity) {
        e->rejected++;
        e->snap.rejected = e->rejected;
        int32_t cap = e->capacity;
        pthread_mutex_unlock(&e->mu);
        free(prompt);
        free(stop);
        return berth_fail(BERTH_E_OVERLOADED, "engine overloaded: %d requests are queued or running (the queue "
                          "holds %d); retry later", (int)cap, (int)cap);
    }
    struct live *l = &e->live[e->n_live++];
    memset(l, 0, sizeof *l);
    l->id = e->next_id++;
    l->cb = cb;
    l->arg = arg;
    l->samples_left = n;
    l->rq.prompt = prompt;
    l->rq.n_prompt = rq->n_prompt;
    l->rq.max_new = rq->max_new_tokens;
    l->rq.n = n;
    l->rq.sampling.temperature = rq->temperature;
    l->rq.sampling.top_k = rq->top_k;
    l->rq.sampling.top_p = rq->top_p > 0 ? rq->top_p : 1.0f;
    l->rq.sampling.seed = rq->seed;
    l->rq.ignore_eos = rq->ignore_eos;
    l->rq.stop_ids = stop;
    l->rq.n_stop_ids = rq->n_stop_ids;
    if (id) *id = l->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return BERTH_OK;
}

berth_status berth_engine_cancel(berth_engine *e, int64_t id)
{
    pthread_mutex_lock(&e->mu);
    int32_t i = live_find(e, id);
    if (i < 0) {
        pthread_mutex_unlock(&e->mu);
        return berth_fail(BERTH_E_NOT_FOUND, "no live request has id %lld", (long long)id);
    }
    for (int32_t k = 0; k < e->n_cancels; k++)
        if (e->cancels[k] == id) i = -1;
    if (i >= 0 && e->n_cancels < e->capacity) e->cancels[e->n_cancels++] = id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return BERTH_OK;
}

berth_status berth_engine_get_stats(berth_engine *e, berth_engine_stats *out)
{
    if (!out || out->struct_size < sizeof *out)
        return berth_fail(BERTH_E_ABI, "engine: stats struct_size %u, expected %zu", out ? out->struct_size : 0u,
                          sizeof *out);
    pthread_mutex_lock(&e->mu);
    *out = e->snap;
    pthread_mutex_unlock(&e->mu);
    return BERTH_OK;
}

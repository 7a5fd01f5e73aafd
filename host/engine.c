/* engine.c — the serving engine of berth.h: loads a checkpoint, runs the scheduler on its own thread, takes
 * submissions through a bounded queue, streams events. */
#include "berth.h"

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "prompt_text.h"
#include "registry.h"
#include "runner.h"
#include "scheduler.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One sample's detokenized output (engine thread only). */
struct sample_text {
    berth_tok_stream *ts;
    char *buf;
    size_t len, cap;
    int cut;                   /* a stop string matched: buf ends before it */
};

/* A submitted request until its last sample is done. */
struct live {
    int64_t id;
    berth_engine_event_fn cb;
    void *arg;
    int32_t samples_left;
    int added;                 /* handed to the scheduler */
    struct sched_request rq;   /* owned copies of prompt / stop ids until added */
    char **stop_str;           /* owned */
    int32_t n_stop_str;
    size_t stop_max;           /* longest stop string, bytes */
    struct sample_text *texts; /* [n] when the engine has a tokenizer, else NULL */
    int32_t n_texts;
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
    berth_tokenizer *tok;      /* NULL when the checkpoint has no tokenizer.json */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    int hold;                  /* berth_engine_hold: new submissions wait in live[] unadded */
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

static void live_free_parts(struct live *l)
{
    free((void *)l->rq.prompt);
    free((void *)l->rq.stop_ids);
    for (int32_t k = 0; k < l->n_stop_str; k++) free(l->stop_str[k]);
    free(l->stop_str);
    for (int32_t k = 0; k < l->n_texts; k++) {
        tok_stream_free(l->texts[k].ts);
        free(l->texts[k].buf);
    }
    free(l->texts);
}

static void live_drop(berth_engine *e, int32_t i)
{
    live_free_parts(&e->live[i]);
    memmove(e->live + i, e->live + i + 1, (size_t)(e->n_live - i - 1) * sizeof *e->live);
    e->n_live--;
}

static void snapshot(berth_engine *e);

/* Append piece to t; 0 when out of memory. */
static int text_append(struct sample_text *t, const char *piece, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->len + n + 1) cap *= 2;
        char *b = realloc(t->buf, cap);
        if (!b) return 0;
        t->buf = b;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, piece, n);
    t->len += n;
    t->buf[t->len] = '\0';
    return 1;
}

/* Detokenize token into sample text t; 1 when a stop string now occurs (t cut before its first occurrence).
 * Only the tail that the new piece could complete is searched. Engine thread. */
static int text_push(struct live *l, struct sample_text *t, int32_t token)
{
    if (!t->ts || t->cut) return 0;
    char *piece = NULL;
    size_t n = 0;
    size_t old = t->len;
    if (tok_stream_push_n(t->ts, token, &piece, &n) != BERTH_OK) {
        /* An id outside the tokenizer (a model with a larger vocabulary): no text for it. */
        free(piece);
        return 0;
    }
    int ok = text_append(t, piece ? piece : "", piece ? n : 0);
    free(piece);
    if (!ok || l->n_stop_str == 0) return 0;
    size_t from = old + 1 > l->stop_max ? old + 1 - l->stop_max : 0;
    size_t best = (size_t)-1;
    for (int32_t k = 0; k < l->n_stop_str; k++) {
        const char *hit = strstr(t->buf + from, l->stop_str[k]);
        if (hit && (size_t)(hit - t->buf) < best) best = (size_t)(hit - t->buf);
    }
    if (best == (size_t)-1) return 0;
    t->len = best;
    t->buf[best] = '\0';
    t->cut = 1;
    return 1;
}

static int on_token_ex(void *arg, int64_t id, int32_t index, int32_t token, const struct runner_sample_out *lp)
{
    berth_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    snapshot(e); /* so a token's observer sees the KV the step took */
    int32_t i = live_find(e, id);
    berth_engine_event_fn cb = i >= 0 ? e->live[i].cb : NULL;
    void *cb_arg = i >= 0 ? e->live[i].arg : NULL;
    int stop = 0;
    /* The live entry's texts array stays put while it lives (entries move, their pointers do not). */
    if (i >= 0 && index < e->live[i].n_texts) stop = text_push(&e->live[i], &e->live[i].texts[index], token);
    pthread_mutex_unlock(&e->mu);
    if (!cb) return stop;
    berth_engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = BERTH_EVENT_TOKEN;
    ev.index = index;
    ev.request_id = id;
    ev.token = token;
    if (lp) {
        ev.has_logprob = 1;
        ev.logprob = lp->logprob;
        ev.n_top = lp->n_top;
        ev.top_ids = lp->top_ids;
        ev.top_logprobs = lp->top_logprobs;
    }
    cb(cb_arg, &ev);
    return stop;
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
    /* The sample's text, finished (held-back bytes flushed unless a stop string cut it), taken out of the entry. */
    char *text = NULL;
    if (i >= 0 && index >= 0 && index < e->live[i].n_texts) {
        struct sample_text *t = &e->live[i].texts[index];
        if (t->ts && !t->cut) {
            char *piece = NULL;
            size_t n = 0;
            if (tok_stream_finish_n(t->ts, &piece, &n) == BERTH_OK && piece) text_append(t, piece, n);
            free(piece);
        }
        if (!t->buf) text_append(t, "", 0);
        text = t->buf;
        t->buf = NULL;
        t->len = t->cap = 0;
    }
    /* Its queue slot frees before the last DONE is delivered: whoever waits for DONE then finds room. */
    if (i >= 0 && --e->live[i].samples_left <= 0) live_drop(e, i);
    pthread_mutex_unlock(&e->mu);
    if (!cb) {
        free(text);
        return;
    }
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
    ev.text = text;
    cb(cb_arg, &ev);
    free(text);
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
    o->recomputed_tokens = s->recomputed_tokens;
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

/* A submission the engine thread has yet to hand to the scheduler (none while held). Under mu. */
static int has_new_submission(const berth_engine *e)
{
    if (e->hold) return 0;
    for (int32_t i = 0; i < e->n_live; i++)
        if (!e->live[i].added) return 1;
    return 0;
}

/* DONE "cancelled" for the n samples left of request id, which the scheduler does not hold (never added, or
 * already gone from it). Not under mu: on_done takes it. */
static void finish_cancelled(berth_engine *e, int64_t id, int32_t n)
{
    for (int32_t k = 0; k < n; k++) on_done(e, id, k, SCHED_FINISH_CANCEL, 0, 0, BERTH_OK, "");
}

static void *engine_main(void *arg)
{
    berth_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stop && !has_new_submission(e) && e->n_cancels == 0 && sched_pending(e->sched) == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) break;
        /* New submissions, in order (none while held). The scheduler copies what it keeps. */
        for (int32_t i = 0; i < e->n_live && !e->hold; i++) {
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
            int32_t i = live_find(e, id);
            /* Held, never added: it finishes here, as berth_engine_destroy finishes such requests. */
            int32_t unadded = i >= 0 && !e->live[i].added ? e->live[i].samples_left : 0;
            pthread_mutex_unlock(&e->mu);
            if (unadded > 0)
                finish_cancelled(e, id, unadded);
            else
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
        for (int32_t i = 0; i < e->n_live; i++) live_free_parts(&e->live[i]);
    free(e->live);
    tok_free(e->tok);
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
    rc.kv_dtype = e->cfg->kv_dtype;
    rc.no_graphs = !e->cfg->sched_graphs;
    rc.overlap = e->cfg->sched_overlap;
    rc.state_snapshots = 2 * rc.max_seqs;
    if ((st = runner_create(&rc, &e->runner))) goto fail;
    e->info = *runner_info(e->runner);
    /* Optional: without tokenizer.json the engine serves ids only (no text, no stop strings). */
    if ((st = prompt_tokenizer_open(dir, 0, &e->tok))) goto fail;
    struct sched_callbacks cb = {NULL, on_done, e, on_token_ex};
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
            finish_cancelled(e, l.id, l.samples_left);
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
    /* The tail fields, read only when the caller's struct has them. */
    berth_engine_request x;
    memset(&x, 0, sizeof x);
    memcpy(&x, rq, rq->struct_size < sizeof x ? (rq->struct_size >= offsetof(berth_engine_request, min_p)
                                                     ? rq->struct_size
                                                     : offsetof(berth_engine_request, min_p))
                                               : sizeof x);
    if (x.top_logprobs < 0 || x.top_logprobs > BERTH_MAX_TOP_LOGPROBS)
        return berth_fail(BERTH_E_INVALID, "engine: top_logprobs = %d must be in 0..%d", (int)x.top_logprobs,
                          BERTH_MAX_TOP_LOGPROBS);
    if (!(x.repetition_penalty >= 0.0f) || !(x.min_p <= 1.0f) || x.presence_penalty != x.presence_penalty ||
        x.frequency_penalty != x.frequency_penalty)
        return berth_fail(BERTH_E_INVALID, "engine: bad sampling parameters (min_p %g, repetition_penalty %g, "
                          "presence_penalty %g, frequency_penalty %g)", (double)x.min_p,
                          (double)x.repetition_penalty, (double)x.presence_penalty, (double)x.frequency_penalty);
    if (x.n_stop_strings < 0 || (x.n_stop_strings > 0 && !x.stop_strings))
        return berth_fail(BERTH_E_INVALID, "engine: bad stop string list (%d strings)", (int)x.n_stop_strings);
    for (int32_t k = 0; k < x.n_stop_strings; k++)
        if (!x.stop_strings[k] || !x.stop_strings[k][0])
            return berth_fail(BERTH_E_INVALID, "engine: stop string %d is empty", (int)k);
    if (x.n_stop_strings > 0 && !e->tok)
        return berth_fail(BERTH_E_UNSUPPORTED, "engine: stop strings need the checkpoint's tokenizer.json, and "
                          "this checkpoint has none");
    struct live nl;
    memset(&nl, 0, sizeof nl);
    if (x.n_stop_strings > 0) nl.stop_str = calloc((size_t)x.n_stop_strings, sizeof *nl.stop_str);
    if (e->tok) nl.texts = calloc((size_t)n, sizeof *nl.texts);
    int oom = (x.n_stop_strings > 0 && !nl.stop_str) || (e->tok && !nl.texts);
    for (int32_t k = 0; !oom && k < x.n_stop_strings; k++) {
        nl.stop_str[k] = strdup(x.stop_strings[k]);
        oom = !nl.stop_str[k];
        nl.n_stop_str = k + 1;
        size_t len = strlen(x.stop_strings[k]);
        if (len > nl.stop_max) nl.stop_max = len;
    }
    if (e->tok) nl.n_texts = n;
    for (int32_t k = 0; !oom && k < nl.n_texts; k++)
        oom = tok_stream_new(e->tok, 1, &nl.texts[k].ts) != BERTH_OK;
    if (oom) {
        live_free_parts(&nl);
        return berth_fail(BERTH_E_NOMEM, "engine: out of host memory");
    }
    int32_t *prompt = malloc((size_t)rq->n_prompt * sizeof *prompt);
    int32_t *stop = malloc((size_t)(rq->n_stop_ids > 0 ? rq->n_stop_ids : 1) * sizeof *stop);
    if (!prompt || !stop) {
        free(prompt);
        free(stop);
        live_free_parts(&nl);
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
        live_free_parts(&nl);
        return berth_fail(BERTH_E_OVERLOADED, "engine overloaded: %d requests are queued or running (the queue "
                          "holds %d); retry later", (int)cap, (int)cap);
    }
    struct live *l = &e->live[e->n_live++];
    *l = nl;
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
    l->rq.sampling.min_p = x.min_p;
    l->rq.sampling.repetition_penalty = x.repetition_penalty;
    l->rq.sampling.presence_penalty = x.presence_penalty;
    l->rq.sampling.frequency_penalty = x.frequency_penalty;
    l->rq.sampling.n_top = x.logprobs ? x.top_logprobs : 0;
    l->rq.logprobs = x.logprobs != 0;
    l->rq.ignore_eos = rq->ignore_eos;
    l->rq.stop_ids = stop;
    l->rq.n_stop_ids = rq->n_stop_ids;
    if (id) *id = l->id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return BERTH_OK;
}

void berth_engine_hold(berth_engine *e, int on)
{
    pthread_mutex_lock(&e->mu);
    e->hold = on != 0;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
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

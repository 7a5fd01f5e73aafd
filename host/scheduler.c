/* scheduler.c — continuous batching with chunked prefill, admission by KV blocks, preemption by recompute, fork
 * for n > 1 samples (see scheduler.h). */
#include "scheduler.h"

#include "errors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { RQ_WAITING, RQ_RUNNING };

struct req {
    int64_t id;
    int32_t index;           /* sample index (0 for the parent) */
    int32_t n_samples;       /* samples still to fork from this one at its first token (1 after) */
    int state;
    int32_t *toks;           /* prompt + generated; capacity n_prompt + max_new */
    int32_t n_prompt, n_toks;
    int32_t n_fed;           /* tokens whose K/V the sequence holds */
    int32_t n_fed_max;       /* most tokens it ever held: below it, feeding again is recompute */
    int32_t seq;             /* -1 while waiting */
    int32_t max_new, n_gen;
    struct runner_sampling sp;
    int32_t logprobs;
    int32_t ignore_eos;
    int32_t *stop;
    int32_t n_stop;
    int32_t cached;          /* prompt tokens the prefix cache served at first admission */
    struct runner_sample_out fork_lp; /* a forked sibling's first token's logprobs, until reported */
    int admitted_once;
};

struct plan_item {
    struct req *rq;
    int32_t n;
    int logits;
};

/* A step whose sample is launched but not collected (overlap, runner.h): its rows' requests in sample order. A
 * request that finishes meanwhile (cancel, or a stop found while collecting the step before) leaves NULL. */
struct inflight {
    int active;
    int slot;                /* runner sample slot, 0 or 1 */
    int32_t n_rows;
    int want_lp;
    struct req **rq;         /* [max_seqs] */
    int32_t *pos;            /* [max_seqs] position of the row's token when it was fed (chained steps), else -1 */
};

struct scheduler {
    struct runner *r;
    struct kv_cache *kv;
    struct sched_callbacks cb;
    struct req **reqs;       /* arrival order; preempted requests keep their place */
    int32_t n_reqs, cap_reqs;
    struct plan_item *plan;
    struct runner_seq_step *steps;
    struct runner_sampling *row_sp;
    struct runner_sample_out *row_lp;
    uint64_t *row_ctr;
    int32_t *row_ids;
    int32_t *need_sum, *need;
    struct inflight infl[2];
    int newest;              /* infl[newest] is the last launched step when active */
    struct sched_stats stats;
};

static void req_free(struct req *q)
{
    if (!q) return;
    free(q->toks);
    free(q->stop);
    free(q);
}

berth_status sched_create(struct runner *r, const struct sched_callbacks *cb, struct scheduler **out)
{
    *out = NULL;
    struct scheduler *s = calloc(1, sizeof *s);
    if (!s) return berth_fail(BERTH_E_NOMEM, "scheduler: out of host memory");
    s->r = r;
    s->kv = runner_kv(r);
    if (cb) s->cb = *cb;
    size_t S = (size_t)runner_max_seqs(r), G = (size_t)(kv_n_groups(s->kv) + 1);
    s->plan = calloc(S, sizeof *s->plan);
    s->steps = calloc(S, sizeof *s->steps);
    s->row_sp = calloc(S, sizeof *s->row_sp);
    s->row_lp = calloc(S, sizeof *s->row_lp);
    s->row_ctr = calloc(S, sizeof *s->row_ctr);
    s->row_ids = calloc(S, sizeof *s->row_ids);
    s->need_sum = calloc(G, sizeof *s->need_sum);
    s->need = calloc(G, sizeof *s->need);
    int infl_ok = 1;
    for (int k = 0; k < 2; k++) {
        s->infl[k].slot = k;
        s->infl[k].rq = calloc(S, sizeof *s->infl[k].rq);
        s->infl[k].pos = calloc(S, sizeof *s->infl[k].pos);
        infl_ok = infl_ok && s->infl[k].rq && s->infl[k].pos;
    }
    if (!s->plan || !s->steps || !s->row_sp || !s->row_lp || !s->row_ctr || !s->row_ids || !s->need_sum || !s->need ||
        !infl_ok) {
        sched_free(s);
        return berth_fail(BERTH_E_NOMEM, "scheduler: out of host memory");
    }
    *out = s;
    return BERTH_OK;
}

void sched_free(struct scheduler *s)
{
    if (!s) return;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        if (s->reqs[i]->seq >= 0) runner_seq_free(s->r, s->reqs[i]->seq);
        req_free(s->reqs[i]);
    }
    free(s->reqs);
    free(s->plan);
    free(s->steps);
    free(s->row_sp);
    free(s->row_lp);
    free(s->row_ctr);
    free(s->row_ids);
    free(s->need_sum);
    free(s->need);
    for (int k = 0; k < 2; k++) {
        free(s->infl[k].rq);
        free(s->infl[k].pos);
    }
    free(s);
}

int32_t sched_pending(const struct scheduler *s) { return s->n_reqs; }

const struct sched_stats *sched_stats(const struct scheduler *s)
{
    struct sched_stats *st = (struct sched_stats *)&s->stats;
    st->running = st->waiting = 0;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        if (s->reqs[i]->state == RQ_RUNNING)
            st->running++;
        else
            st->waiting++;
    }
    return st;
}

static int32_t ceil_div(int64_t a, int64_t b) { return (int32_t)((a + b - 1) / b); }

static berth_status insert_at(struct scheduler *s, int32_t pos, struct req *q)
{
    if (s->n_reqs == s->cap_reqs) {
        int32_t cap = s->cap_reqs ? s->cap_reqs * 2 : 16;
        struct req **n = realloc(s->reqs, (size_t)cap * sizeof *n);
        if (!n) return berth_fail(BERTH_E_NOMEM, "scheduler: out of host memory");
        s->reqs = n;
        s->cap_reqs = cap;
    }
    memmove(s->reqs + pos + 1, s->reqs + pos, (size_t)(s->n_reqs - pos) * sizeof *s->reqs);
    s->reqs[pos] = q;
    s->n_reqs++;
    return BERTH_OK;
}

static void remove_at(struct scheduler *s, int32_t pos)
{
    memmove(s->reqs + pos, s->reqs + pos + 1, (size_t)(s->n_reqs - pos - 1) * sizeof *s->reqs);
    s->n_reqs--;
}

static int32_t find_req(const struct scheduler *s, const struct req *q)
{
    for (int32_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i] == q) return i;
    return -1;
}

/* Finish q: free its KV, report, drop it. */
static void finish(struct scheduler *s, struct req *q, const char *why, berth_status st, const char *msg)
{
    /* Its rows of steps in flight are dropped when collected. Freeing its KV while such a step still runs is
     * safe: every later use of those blocks is enqueued after it on the same stream. */
    for (int k = 0; k < 2; k++)
        for (int32_t i = 0; s->infl[k].active && i < s->infl[k].n_rows; i++)
            if (s->infl[k].rq[i] == q) s->infl[k].rq[i] = NULL;
    if (q->seq >= 0) runner_seq_free(s->r, q->seq);
    q->seq = -1;
    if (strcmp(why, SCHED_FINISH_CANCEL) == 0)
        s->stats.cancelled++;
    else if (strcmp(why, SCHED_FINISH_ERROR) == 0)
        s->stats.failed++;
    else
        s->stats.finished++;
    int32_t pos = find_req(s, q);
    if (pos >= 0) remove_at(s, pos);
    if (s->cb.on_done) s->cb.on_done(s->cb.arg, q->id, q->index, why, q->n_gen, q->cached, st, msg);
    req_free(q);
}

berth_status sched_add(struct scheduler *s, int64_t id, const struct sched_request *rq)
{
    const berth_model_info *info = runner_info(s->r);
    berth_status st = runner_check_prompt(info, NULL, rq->prompt, rq->n_prompt, rq->max_new);
    if (st) return st;
    int32_t n = rq->n > 0 ? rq->n : 1;
    if (n > runner_max_seqs(s->r))
        return berth_fail(BERTH_E_INVALID, "n = %d samples exceed [scheduler] max_seqs = %d", (int)n,
                          (int)runner_max_seqs(s->r));
    if (rq->n_stop_ids < 0 || (rq->n_stop_ids > 0 && !rq->stop_ids))
        return berth_fail(BERTH_E_INVALID, "bad stop id list (%d ids)", (int)rq->n_stop_ids);
    if (rq->logprobs && (rq->sampling.n_top < 0 || rq->sampling.n_top > RUNNER_MAX_TOP_LOGPROBS))
        return berth_fail(BERTH_E_INVALID, "top logprobs = %d must be in 0..%d", (int)rq->sampling.n_top,
                          RUNNER_MAX_TOP_LOGPROBS);
    if (rq->sampling.repetition_penalty < 0.0f)
        return berth_fail(BERTH_E_INVALID, "repetition penalty = %g must be > 0",
                          (double)rq->sampling.repetition_penalty);
    for (int32_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i]->id == id) return berth_fail(BERTH_E_INVALID, "request id %lld is already in use", (long long)id);
    /* Alone, it must fit: the prompt and every sample's tokens (sliding groups: at most their window bound). */
    int32_t bs = kv_block_size(s->kv);
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++) {
        int64_t need = ceil_div((int64_t)rq->n_prompt + rq->max_new, bs);
        if (n > 1) need += (int64_t)(n - 1) * (ceil_div(rq->max_new, bs) + 1);
        if (kv_group_is_sliding(s->kv, g) && need > (int64_t)n * kv_group_seq_cap(s->kv, g))
            need = (int64_t)n * kv_group_seq_cap(s->kv, g);
        if (need > kv_blocks_total(s->kv, g))
            return berth_fail(BERTH_E_DEVICE_OOM,
                              "request needs %lld KV blocks of group '%s' (%d prompt + %d new tokens x %d samples), "
                              "the cache has %d (raise [kv] memory)",
                              (long long)need, kv_group_name(s->kv, g), (int)rq->n_prompt, (int)rq->max_new, (int)n,
                              (int)kv_blocks_total(s->kv, g));
    }
    struct req *q = calloc(1, sizeof *q);
    if (!q) return berth_fail(BERTH_E_NOMEM, "scheduler: out of host memory");
    q->toks = malloc((size_t)(rq->n_prompt + rq->max_new) * sizeof *q->toks);
    q->stop = malloc((size_t)(rq->n_stop_ids > 0 ? rq->n_stop_ids : 1) * sizeof *q->stop);
    if (!q->toks || !q->stop) {
        req_free(q);
        return berth_fail(BERTH_E_NOMEM, "scheduler: out of host memory");
    }
    memcpy(q->toks, rq->prompt, (size_t)rq->n_prompt * sizeof *q->toks);
    if (rq->n_stop_ids > 0) memcpy(q->stop, rq->stop_ids, (size_t)rq->n_stop_ids * sizeof *q->stop);
    q->id = id;
    q->n_samples = n;
    q->state = RQ_WAITING;
    q->n_prompt = q->n_toks = rq->n_prompt;
    q->seq = -1;
    q->max_new = rq->max_new;
    q->sp = rq->sampling;
    q->sp.history = NULL;
    q->sp.n_history = 0;
    q->logprobs = rq->logprobs != 0;
    if (!q->logprobs) q->sp.n_top = 0;
    q->ignore_eos = rq->ignore_eos;
    q->n_stop = rq->n_stop_ids;
    st = insert_at(s, s->n_reqs, q);
    if (st) req_free(q);
    return st;
}

berth_status sched_cancel(struct scheduler *s, int64_t id)
{
    int found = 0;
    for (int32_t i = 0; i < s->n_reqs;) {
        if (s->reqs[i]->id == id) {
            finish(s, s->reqs[i], SCHED_FINISH_CANCEL, BERTH_OK, "");
            found = 1;
        } else {
            i++;
        }
    }
    return found ? BERTH_OK : berth_fail(BERTH_E_INVALID, "no live request has id %lld", (long long)id);
}

/* ---- planning ---- */

static int fits(struct scheduler *s)
{
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++)
        if (s->need_sum[g] + s->need[g] > kv_blocks_available(s->kv, g)) return 0;
    return 1;
}

static void compute_need(struct scheduler *s, const struct req *q, int32_t n)
{
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++) s->need[g] = kv_seq_blocks_needed(s->kv, q->seq, g, q->n_fed + n);
}

/* Blocks of sequence seq in group g now (table entries holding a block). */
static int32_t seq_blocks_held(const struct kv_cache *kv, int32_t seq, int32_t g)
{
    int32_t bs = kv_block_size(kv), n = 0, len = kv_seq_len(kv, seq);
    for (int32_t pos = 0; pos < len; pos += bs)
        if (kv_seq_block(kv, seq, g, pos) >= 0) n++;
    return n;
}

/* Admission charge (scheduler.h, "Admission"): into s->need, per group, the blocks q can touch from now to its
 * end, at least what its first chunk of n tokens takes. Full groups: every position up to prompt + max_new,
 * plus, for n > 1, each later sample's own generated blocks and a copy-on-write block. Sliding groups: the same,
 * but never more than the window bound kv_group_seq_cap (ceil((window - 1 + chunk) / block_size) + 1, what a
 * sequence can hold at once) per sample, less what the sequence already holds from the prefix cache. */
static void compute_admission_charge(struct scheduler *s, const struct req *q, int32_t n)
{
    int32_t bs = kv_block_size(s->kv);
    int32_t left_new = q->max_new - q->n_gen;
    int64_t end = (int64_t)q->n_toks + left_new;
    int32_t end_len = end > INT32_MAX ? INT32_MAX : (int32_t)end;
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++) {
        int32_t first = kv_seq_blocks_needed(s->kv, q->seq, g, q->n_fed + n);
        int64_t charge = kv_seq_blocks_needed(s->kv, q->seq, g, end_len);
        if (q->n_samples > 1) charge += (int64_t)(q->n_samples - 1) * (ceil_div(left_new, bs) + 1);
        if (kv_group_is_sliding(s->kv, g)) {
            int64_t bound = (int64_t)q->n_samples * kv_group_seq_cap(s->kv, g) - seq_blocks_held(s->kv, q->seq, g);
            if (charge > bound) charge = bound;
        }
        if (charge < first) charge = first;
        s->need[g] = charge > INT32_MAX ? INT32_MAX : (int32_t)charge;
    }
}

static void preempt(struct scheduler *s, struct req *v, int32_t *n_plan, int32_t *budget)
{
    for (int32_t i = 0; i < *n_plan; i++) {
        if (s->plan[i].rq != v) continue;
        *budget += s->plan[i].n;
        for (int32_t g = 0; g < kv_n_groups(s->kv); g++)
            s->need_sum[g] -= kv_seq_blocks_needed(s->kv, v->seq, g, v->n_fed + s->plan[i].n);
        memmove(s->plan + i, s->plan + i + 1, (size_t)(*n_plan - i - 1) * sizeof *s->plan);
        (*n_plan)--;
        break;
    }
    runner_seq_free(s->r, v->seq);
    v->seq = -1;
    v->n_fed = 0;
    v->state = RQ_WAITING;
    s->stats.preemptions++;
}

static void add_need(struct scheduler *s)
{
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++) s->need_sum[g] += s->need[g];
}

/* Sequence slots the running requests hold or will hold after their forks. */
static int32_t seqs_reserved(const struct scheduler *s)
{
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i]->state == RQ_RUNNING) n += s->reqs[i]->n_samples;
    return n;
}

static int32_t build_plan(struct scheduler *s)
{
    int32_t budget = runner_max_batch_tokens(s->r), n_plan = 0;
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++) s->need_sum[g] = 0;
    for (int32_t i = 0; i < s->n_reqs && budget > 0; i++) {
        struct req *q = s->reqs[i];
        if (q->state != RQ_RUNNING) continue;
        int32_t n = q->n_toks - q->n_fed;
        if (n > budget) n = budget;
        compute_need(s, q, n);
        int self_preempted = 0;
        while (!fits(s)) {
            /* The latest-arrived other running request gives its KV back (recompute later). */
            struct req *v = NULL;
            for (int32_t j = s->n_reqs - 1; j > i && !v; j--)
                if (s->reqs[j]->state == RQ_RUNNING) v = s->reqs[j];
            if (!v) {
                preempt(s, q, &n_plan, &budget);
                self_preempted = 1;
                break;
            }
            preempt(s, v, &n_plan, &budget);
        }
        if (self_preempted) continue;
        add_need(s);
        s->plan[n_plan].rq = q;
        s->plan[n_plan].n = n;
        s->plan[n_plan].logits = q->n_fed + n == q->n_toks;
        n_plan++;
        budget -= n;
    }
    /* Admission, first come first served: stop at the first that does not fit. */
    for (int32_t i = 0; i < s->n_reqs && budget > 0; i++) {
        struct req *q = s->reqs[i];
        if (q->state != RQ_WAITING) continue;
        if (seqs_reserved(s) + q->n_samples > runner_max_seqs(s->r)) break;
        int32_t seq, cached = 0;
        if (runner_seq_new(s->r, &seq) != BERTH_OK) break;
        if (runner_seq_attach_prefix(s->r, seq, q->toks, q->n_toks, &cached) != BERTH_OK) {
            runner_seq_free(s->r, seq);
            break;
        }
        q->seq = seq;
        q->n_fed = cached;
        int32_t n = q->n_toks - cached;
        if (n > budget) n = budget;
        compute_admission_charge(s, q, n);
        if (!fits(s)) {
            runner_seq_abandon(s->r, seq, cached); /* retried later: count its prefix hit only when it runs */
            q->seq = -1;
            q->n_fed = 0;
            break;
        }
        s->stats.cached_tokens += cached;
        if (!q->admitted_once) q->cached = cached;
        q->admitted_once = 1;
        q->state = RQ_RUNNING;
        add_need(s);
        s->plan[n_plan].rq = q;
        s->plan[n_plan].n = n;
        s->plan[n_plan].logits = q->n_fed + n == q->n_toks;
        n_plan++;
        budget -= n;
    }
    return n_plan;
}

static int is_stop(const struct scheduler *s, const struct req *q, int32_t tok)
{
    if (!q->ignore_eos) {
        const berth_model_info *info = runner_info(s->r);
        for (int32_t i = 0; i < info->n_eos; i++)
            if (info->eos_ids[i] == tok) return 1;
    }
    for (int32_t i = 0; i < q->n_stop; i++)
        if (q->stop[i] == tok) return 1;
    return 0;
}

/* q's sampling parameters for its next token, the penalty history pointing into q->toks (scheduler.h). */
static struct runner_sampling row_sampling(const struct req *q)
{
    struct runner_sampling sp = q->sp;
    int with_prompt = sp.repetition_penalty != 0.0f && sp.repetition_penalty != 1.0f;
    sp.history = with_prompt ? q->toks : q->toks + q->n_prompt;
    sp.n_history = with_prompt ? q->n_toks : q->n_toks - q->n_prompt;
    sp.n_history_prompt = with_prompt ? q->n_prompt : 0;
    return sp;
}

/* Append a sampled token (lp: its logprobs, or NULL); finish the request when it stops. */
static void take_token(struct scheduler *s, struct req *q, int32_t tok, const struct runner_sample_out *lp)
{
    q->toks[q->n_toks++] = tok;
    q->n_gen++;
    int asked = 0;
    if (s->cb.on_token_ex)
        asked = s->cb.on_token_ex(s->cb.arg, q->id, q->index, tok, q->logprobs ? lp : NULL);
    else if (s->cb.on_token)
        s->cb.on_token(s->cb.arg, q->id, q->index, tok);
    if (asked || is_stop(s, q, tok))
        finish(s, q, SCHED_FINISH_STOP, BERTH_OK, "");
    else if (q->n_gen >= q->max_new)
        finish(s, q, SCHED_FINISH_LENGTH, BERTH_OK, "");
}

/* Fork q's n_samples - 1 siblings right after it (same K/V, seeds seed + index); each samples from q's row. */
static berth_status fork_samples(struct scheduler *s, struct req *q, int32_t row)
{
    int32_t pos = find_req(s, q);
    for (int32_t k = q->n_samples - 1; k >= 1; k--) {
        struct req *c = calloc(1, sizeof *c);
        if (!c) return berth_fail(BERTH_E_NOMEM, "scheduler: out of host memory");
        *c = *q;
        c->toks = malloc((size_t)(q->n_prompt + q->max_new) * sizeof *c->toks);
        c->stop = malloc((size_t)(q->n_stop > 0 ? q->n_stop : 1) * sizeof *c->stop);
        if (!c->toks || !c->stop) {
            req_free(c);
            return berth_fail(BERTH_E_NOMEM, "scheduler: out of host memory");
        }
        memcpy(c->toks, q->toks, (size_t)q->n_toks * sizeof *c->toks);
        memcpy(c->stop, q->stop, (size_t)(q->n_stop > 0 ? q->n_stop : 1) * sizeof *c->stop);
        c->index = k;
        c->n_samples = 1;
        c->sp.seed = q->sp.seed + (uint64_t)k;
        berth_status st = runner_seq_fork(s->r, q->seq, &c->seq);
        if (!st) st = insert_at(s, pos + 1, c);
        if (st) {
            if (c->seq >= 0) runner_seq_free(s->r, c->seq);
            req_free(c);
            return st;
        }
        s->stats.forks++;
    }
    q->n_samples = 1;
    /* The siblings sit at pos + 1 .. pos + n - 1 in index order. */
    for (int32_t k = 1; pos + k < s->n_reqs && s->reqs[pos + k]->id == q->id && s->reqs[pos + k]->index == k; k++) {
        struct req *c = s->reqs[pos + k];
        uint64_t ctr = (uint64_t)c->n_toks;
        int32_t tok;
        struct runner_sampling sp = row_sampling(c);
        berth_status st = runner_sample_rows_lp(s->r, row, 1, &sp, &ctr, &tok, c->logprobs ? &c->fork_lp : NULL);
        if (st) return st;
        c->toks[c->n_toks++] = tok;
    }
    return BERTH_OK;
}

/* ---- overlap (runner.h, "Overlap") ---- */

static int32_t infl_row_of(const struct inflight *f, const struct req *q)
{
    for (int32_t i = 0; f->active && i < f->n_rows; i++)
        if (f->rq[i] == q) return i;
    return -1;
}

/* Fail every request with a row in f (the step's sample could not be launched or read). */
static void fail_inflight(struct scheduler *s, struct inflight *f, berth_status st)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", berth_last_error());
    for (int32_t i = 0; f->active && i < f->n_rows; i++)
        if (f->rq[i]) finish(s, f->rq[i], SCHED_FINISH_ERROR, st, msg);
    f->active = 0;
}

/* Sample the last step's logit rows (plan order) into slot f, without waiting: f goes in flight. */
static berth_status launch_sample(struct scheduler *s, struct inflight *f, struct req *const *rqs, const int32_t *pos,
                                  int32_t rows, int chained)
{
    int want_lp = 0;
    for (int32_t i = 0; i < rows; i++) {
        struct req *q = rqs[i];
        want_lp |= q->logprobs;
        s->row_sp[i] = row_sampling(q);
        /* the position the token takes: after the token still in flight when chained */
        s->row_ctr[i] = (uint64_t)q->n_toks + (chained ? 1u : 0u);
        f->rq[i] = q;
        f->pos[i] = pos ? pos[i] : -1;
    }
    f->n_rows = rows;
    f->want_lp = want_lp;
    berth_status st = runner_sample_launch(s->r, f->slot, 0, rows, s->row_sp, s->row_ctr, want_lp);
    f->active = 1;
    s->newest = (int)(f - s->infl);
    return st;
}

/* Collect f: each row's token to its request (which may finish it), and, for a request that has a row in the other
 * step in flight (fed with exactly this token), that token to the prefix cache. */
static void collect(struct scheduler *s, struct inflight *f)
{
    struct inflight *g = &s->infl[1 - (int)(f - s->infl)];
    berth_status st = runner_sample_collect(s->r, f->slot, s->row_ids, f->want_lp ? s->row_lp : NULL);
    if (st) {
        fail_inflight(s, f, st);
        return;
    }
    for (int32_t i = 0; i < f->n_rows; i++) {
        struct req *q = f->rq[i];
        if (!q) continue;
        int32_t tok = s->row_ids[i];
        int32_t j = infl_row_of(g, q);
        take_token(s, q, tok, f->want_lp ? &s->row_lp[i] : NULL); /* may finish q (and clear its row j) */
        if (j >= 0 && g->rq[j] == q) {
            st = runner_seq_publish(s->r, q->seq, g->pos[j], &tok, 1);
            if (st) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", berth_last_error());
                finish(s, q, SCHED_FINISH_ERROR, st, msg);
            }
        }
    }
    f->active = 0;
}

/* Step N+1 of the requests decoding in f (step N, in flight) before f's tokens are known: each feeds its token
 * from the device. Only when that is the step the planner would make: no waiting request it could admit (its
 * sequence slots are taken), every running request decoding in f, no penalties (their history lacks the token in
 * flight), and the KV blocks at hand. Requests whose token in f is their last (max_new) get no row. A request
 * that stops on f's token frees its slot one step later than without overlap. 1 when launched. */
static int chain(struct scheduler *s, struct inflight *f, int *failed)
{
    *failed = 0;
    if (!runner_can_feed(s->r)) return 0;
    int32_t alive = 0, running = 0, ending = 0;
    for (int32_t i = 0; i < f->n_rows; i++)
        if (f->rq[i]) {
            alive++;
            ending += f->rq[i]->n_gen + 1 >= f->rq[i]->max_new; /* its token in flight is its last */
        }
    const struct req *first_waiting = NULL;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        const struct req *q = s->reqs[i];
        if (q->state != RQ_RUNNING) {
            if (!first_waiting) first_waiting = q;
            continue;
        }
        if (runner_sampling_uses_penalties(&q->sp)) return 0;
        running++;
    }
    if (running != alive || alive == 0) return 0;
    /* A waiting request the planner could admit now (first come, first served: the first waiting one; admission
     * needs its sequence slots, counting those the requests ending by length give back) means a normal step. When
     * the slots are full the plan is the decode rows alone: chain (a serving queue longer than max_seqs). */
    if (first_waiting && seqs_reserved(s) - ending + first_waiting->n_samples <= runner_max_seqs(s->r)) return 0;
    int32_t n = 0;
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++) s->need_sum[g] = 0;
    for (int32_t i = 0; i < f->n_rows; i++) {
        struct req *q = f->rq[i];
        if (!q || q->n_gen + 1 >= q->max_new) continue;
        compute_need(s, q, 1);
        add_need(s);
        s->plan[n].rq = q;
        s->plan[n].n = 1;
        s->plan[n].logits = 1;
        s->steps[n].seq = q->seq;
        s->steps[n].ids = NULL;
        s->steps[n].n = 1;
        s->steps[n].logits = RUNNER_LOGITS_LAST;
        s->steps[n].is_decode = 1;
        s->steps[n].feed_row = i;
        n++;
    }
    if (n == 0) return 0;
    for (int32_t g = 0; g < kv_n_groups(s->kv); g++)
        if (s->need_sum[g] > kv_blocks_available(s->kv, g)) return 0;
    berth_status st = runner_step(s->r, s->steps, n);
    s->stats.steps++;
    struct inflight *h = &s->infl[1 - (int)(f - s->infl)];
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", berth_last_error());
        for (int32_t i = 0; i < n; i++) finish(s, s->plan[i].rq, SCHED_FINISH_ERROR, st, msg);
        *failed = 1;
        return 1;
    }
    s->stats.decode_rows += n;
    s->stats.chained_steps++;
    for (int32_t i = 0; i < n; i++) {
        struct req *q = s->plan[i].rq;
        h->rq[i] = q;
        h->pos[i] = q->n_fed;
        q->n_fed += 1;
        if (q->n_fed > q->n_fed_max) q->n_fed_max = q->n_fed;
    }
    st = launch_sample(s, h, h->rq, h->pos, n, 1);
    if (st) {
        fail_inflight(s, h, st);
        *failed = 1;
    }
    return 1;
}

berth_status sched_step(struct scheduler *s, int *did_work)
{
    *did_work = 0;
    /* A step in flight: launch the next one from it when nothing else needs planning, then collect it (its
     * tokens arrive while the new step runs); else collect it and plan normally. */
    struct inflight *f = &s->infl[s->newest];
    if (f->active) {
        *did_work = 1;
        int failed = 0;
        if (chain(s, f, &failed)) {
            collect(s, f);
            return BERTH_OK;
        }
        collect(s, f);
    }
    int32_t n_plan = build_plan(s);
    if (n_plan == 0) return BERTH_OK;
    *did_work = 1;
    int n_dec = 0, n_pre = 0;
    for (int32_t i = 0; i < n_plan; i++) {
        struct plan_item *p = &s->plan[i];
        struct req *q = p->rq;
        int is_decode = p->n == 1 && q->n_gen > 0 && q->n_fed == q->n_toks - 1;
        s->steps[i].seq = q->seq;
        s->steps[i].ids = q->toks + q->n_fed;
        s->steps[i].n = p->n;
        s->steps[i].logits = p->logits ? RUNNER_LOGITS_LAST : RUNNER_LOGITS_NONE;
        s->steps[i].is_decode = is_decode;
        s->steps[i].feed_row = 0;
        if (is_decode)
            n_dec++;
        else
            n_pre += p->n;
    }
    berth_status st = runner_step(s->r, s->steps, n_plan);
    s->stats.steps++;
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", berth_last_error());
        for (int32_t i = 0; i < n_plan; i++) finish(s, s->plan[i].rq, SCHED_FINISH_ERROR, st, msg);
        return BERTH_OK;
    }
    s->stats.decode_rows += n_dec;
    if (n_dec > 0 && n_pre > 0) s->stats.mixed_steps++;
    int32_t rows = 0, want_lp = 0;
    for (int32_t i = 0; i < n_plan; i++) {
        struct plan_item *p = &s->plan[i];
        struct req *q = p->rq;
        if (!s->steps[i].is_decode) {
            /* Positions below n_fed_max were computed before a preemption. */
            int32_t hi = q->n_fed + p->n < q->n_fed_max ? q->n_fed + p->n : q->n_fed_max;
            int32_t again = hi > q->n_fed ? hi - q->n_fed : 0;
            s->stats.recomputed_tokens += again;
            s->stats.prefill_tokens += p->n - again;
        }
        q->n_fed += p->n;
        if (q->n_fed > q->n_fed_max) q->n_fed_max = q->n_fed;
        if (p->logits) {
            want_lp |= q->logprobs;
            s->row_sp[rows] = row_sampling(q);
            s->row_ctr[rows] = (uint64_t)p->rq->n_toks;
            rows++;
        }
    }
    if (rows == 0) return BERTH_OK;
    int forks = 0;
    for (int32_t i = 0; i < n_plan; i++) forks |= s->plan[i].logits && s->plan[i].rq->n_samples > 1;
    if (runner_can_feed(s->r) && !forks) {
        /* Leave the sample in flight: the next call chains the following step to it or collects it. */
        struct inflight *nf = &s->infl[1 - s->newest];
        int32_t k = 0;
        for (int32_t i = 0; i < n_plan; i++)
            if (s->plan[i].logits) nf->rq[k++] = s->plan[i].rq;
        st = launch_sample(s, nf, nf->rq, NULL, rows, 0);
        if (st) fail_inflight(s, nf, st);
        return BERTH_OK;
    }
    st = runner_sample_rows_lp(s->r, 0, rows, s->row_sp, s->row_ctr, s->row_ids, want_lp ? s->row_lp : NULL);
    if (!st) {
        /* Forks first (they sample the parent's row, still in the logits buffer), then the tokens. */
        int32_t row = 0;
        for (int32_t i = 0; i < n_plan && !st; i++) {
            if (!s->plan[i].logits) continue;
            if (s->plan[i].rq->n_samples > 1) st = fork_samples(s, s->plan[i].rq, row);
            row++;
        }
    }
    if (st) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", berth_last_error());
        for (int32_t i = 0; i < n_plan; i++) {
            int64_t id = s->plan[i].rq->id;
            for (int32_t j = 0; j < s->n_reqs;)
                if (s->reqs[j]->id == id)
                    finish(s, s->reqs[j], SCHED_FINISH_ERROR, st, msg);
                else
                    j++;
        }
        return BERTH_OK;
    }
    /* Siblings forked this step already hold their token: report it (and stop them) before the parents'. */
    int32_t row = 0;
    for (int32_t i = 0; i < n_plan; i++) {
        struct plan_item *p = &s->plan[i];
        if (!p->logits) continue;
        struct req *q = p->rq;
        const struct runner_sample_out *lp = want_lp ? &s->row_lp[row] : NULL;
        int32_t tok = s->row_ids[row++];
        int64_t id = q->id;
        take_token(s, q, tok, lp);
        for (int32_t j = 0; j < s->n_reqs;) {
            struct req *c = s->reqs[j];
            if (c->id == id && c->index > 0 && c->n_gen == 0 && c->n_toks > c->n_fed) {
                /* fork_samples appended the token without reporting it */
                c->n_toks--;
                int32_t ct = c->toks[c->n_toks];
                int32_t before = s->n_reqs;
                take_token(s, c, ct, &c->fork_lp);
                if (s->n_reqs < before) continue; /* c finished and was removed */
            }
            j++;
        }
    }
    return BERTH_OK;
}

/* test_engine_sampling.c — sampling parameters and stop strings through the runner, the scheduler and the
 * engine, on the tiny Gemma 4 checkpoint (tests/fixtures/tiny-gemma4, which has a tokenizer.json), CPU backend:
 *  - the logprob of the chosen token and the top-k logprobs equal a host log-softmax of the runner's logits;
 *  - repetition / presence / frequency penalties move exactly the history ids as backend.h specifies;
 *  - the scheduler's penalty history: prompt ids count with a repetition penalty, not for presence alone;
 *  - seeded sampling with min_p, penalties and logprobs gives the same tokens and logprobs alone and batched;
 *  - stop strings: a substring of a greedy output, requested as a stop string, cuts the text before it
 *    (finish "stop") after exactly the tokens that complete it. */
#include <math.h>
#include <pthread.h>

#include "berth.h"
#include "prompt_text.h"
#include "scheduler.h"
#include "test_gemma4_fixture.h"
#include "check_run.h"

#define GEN 8

static char *tiny_dir;

/* Prompts: text encoded with the checkpoint's own tokenizer (its reference.json is for the parity tests). */
struct tprompts {
    struct g4_prompt prompts[4];
    int32_t n_prompts;
    int32_t vocab;
};

static void load_prompts(struct tprompts *f)
{
    static const char *texts[4] = {"The quick brown fox jumps over the lazy dog.", "Once upon a time",
                                   "1, 2, 3, 4, 5, 6, 7, 8,", "Paged attention keeps the KV cache in blocks; "
                                   "a prefix cache shares them between requests."};
    berth_tokenizer *tok = NULL;
    ck_assert_msg(prompt_tokenizer_open(tiny_dir, 1, &tok) == BERTH_OK, "%s", berth_last_error());
    memset(f, 0, sizeof *f);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(prompt_encode(tok, texts[i], 1, &f->prompts[i].ids, &f->prompts[i].n) == BERTH_OK, "%s",
                      berth_last_error());
    f->n_prompts = 4;
    f->vocab = (int32_t)tok_vocab_size(tok);
    tok_free(tok);
}

static void free_prompts(struct tprompts *f)
{
    for (int i = 0; i < f->n_prompts; i++) free(f->prompts[i].ids);
}

static void open_tiny(struct g4_session *s) { g4_open(tiny_dir, 8, 4, s); }

/* As g4_open (blocks of 4 tokens, 8 tokens a step) with max_seqs sequences. */
static void open_seqs(int32_t max_seqs, struct g4_session *s)
{
    memset(s, 0, sizeof *s);
    char *cp = g4_config_path();
    ck_assert_msg(config_load(cp, &s->cfg) == BERTH_OK, "%s", berth_last_error());
    free(cp);
    ck_assert_msg(registry_load(s->cfg, &s->reg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(ckpt_open(tiny_dir, &s->ck) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(registry_select(s->reg, s->ck, &s->sel) == BERTH_OK, "%s", berth_last_error());
    s->have_sel = 1;
    struct runner_config rc;
    memset(&rc, 0, sizeof rc);
    rc.be = &s->sel.api;
    rc.mvt = s->sel.model_plugin->desc->vtable;
    rc.model = s->sel.model;
    rc.ck = s->ck;
    rc.model_dir = tiny_dir;
    rc.max_batch_tokens = 8;
    rc.max_seqs = max_seqs;
    rc.kv_block_size = 4;
    rc.kv_memory = s->cfg->kv_memory_bytes;
    rc.overlap = s->cfg->sched_overlap;
    ck_assert_msg(runner_create(&rc, &s->r) == BERTH_OK, "%s", berth_last_error());
}

/* Host log-softmax (double) of z[0..V). */
static void log_softmax(const float *z, int32_t V, double *out)
{
    double m = z[0];
    for (int32_t v = 1; v < V; v++) m = z[v] > m ? z[v] : m;
    double sum = 0;
    for (int32_t v = 0; v < V; v++) sum += exp((double)z[v] - m);
    double lse = m + log(sum);
    for (int32_t v = 0; v < V; v++) out[v] = (double)z[v] - lse;
}

/* Checks out against the log-softmax of z: the chosen id's logprob and the n_top best, best first. */
static void check_lp(const float *z, int32_t V, int32_t tok, const struct runner_sample_out *o, int32_t n_top)
{
    double *ls = malloc((size_t)V * sizeof *ls);
    log_softmax(z, V, ls);
    ck_assert_msg(fabs(o->logprob - ls[tok]) <= 1e-5, "logprob %g, host %g", (double)o->logprob, ls[tok]);
    ck_assert_int_eq(o->n_top, n_top);
    for (int32_t k = 0; k < n_top; k++) {
        int32_t id = o->top_ids[k];
        ck_assert(id >= 0 && id < V);
        ck_assert_msg(fabs(o->top_logprobs[k] - ls[id]) <= 1e-5, "top %d: %g vs %g", (int)k,
                      (double)o->top_logprobs[k], ls[id]);
        /* Exactly the k-th largest: count ids strictly better (or equal with a lower id). */
        int32_t better = 0;
        for (int32_t v = 0; v < V; v++)
            if (z[v] > z[id] || (z[v] == z[id] && v < id)) better++;
        ck_assert_int_eq(better, k);
    }
    free(ls);
}

static void prefill_last(struct g4_session *s, const struct g4_prompt *p, float *logits)
{
    int32_t seq;
    ck_assert_int_eq(runner_seq_new(s->r, &seq), BERTH_OK);
    ck_assert_msg(runner_prefill(s->r, seq, p->ids, p->n, 0, logits) == BERTH_OK, "%s", berth_last_error());
    runner_seq_free(s->r, seq);
}

START_TEST(test_logprobs_match_host)
{
    struct tprompts f;
    load_prompts(&f);
    struct g4_session s;
    open_tiny(&s);
    const int32_t V = runner_info(s.r)->vocab_size;
    float *z = malloc((size_t)V * sizeof *z);
    prefill_last(&s, &f.prompts[0], z);
    int32_t row = runner_n_logits(s.r) - 1;
    struct runner_sampling sp[2];
    memset(sp, 0, sizeof sp);
    sp[0].top_p = sp[1].top_p = 1.0f;
    sp[0].n_top = 5;                       /* greedy */
    sp[1].temperature = 0.8f, sp[1].seed = 3, sp[1].n_top = 20;
    for (int i = 0; i < 2; i++) {
        struct runner_sample_out o;
        int32_t tok;
        uint64_t ctr = 7;
        ck_assert_msg(runner_sample_rows_lp(s.r, row, 1, &sp[i], &ctr, &tok, &o) == BERTH_OK, "%s",
                      berth_last_error());
        check_lp(z, V, tok, &o, sp[i].n_top);
        if (i == 0) ck_assert_int_eq(tok, o.top_ids[0]);
    }
    sp[0].n_top = RUNNER_MAX_TOP_LOGPROBS + 1;
    int32_t tok;
    uint64_t ctr = 0;
    struct runner_sample_out o;
    ck_assert_int_eq(runner_sample_rows_lp(s.r, row, 1, &sp[0], &ctr, &tok, &o), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "row 0: top logprobs = 21 must be in 0..20");
    free(z);
    g4_close(&s);
    free_prompts(&f);
}
END_TEST

/* backend.h step 1 on the host, with history_output_start: hist[0..n_prompt) is prompt (repetition only), the rest
 * output (n_prompt 0: the whole history counts for all three penalties). */
static void penalise(float *z, const int32_t *hist, int32_t n, int32_t n_prompt, float rep, float pres, float freq,
                     int32_t V)
{
    int32_t *cnt = calloc((size_t)V, sizeof *cnt), *out = calloc((size_t)V, sizeof *out);
    for (int32_t i = 0; i < n; i++) cnt[hist[i]]++, out[hist[i]] += i >= n_prompt;
    for (int32_t v = 0; v < V; v++) {
        if (!cnt[v]) continue;
        if (rep != 1.0f) z[v] = z[v] > 0 ? z[v] / rep : z[v] * rep;
        if (out[v]) {
            z[v] -= pres;
            z[v] -= freq * (float)out[v];
        }
    }
    free(cnt), free(out);
}

START_TEST(test_penalties_as_specified)
{
    struct tprompts f;
    load_prompts(&f);
    struct g4_session s;
    open_tiny(&s);
    const int32_t V = runner_info(s.r)->vocab_size;
    float *z = malloc((size_t)V * sizeof *z), *pz = malloc((size_t)V * sizeof *pz);
    prefill_last(&s, &f.prompts[0], z);
    int32_t row = runner_n_logits(s.r) - 1;
    /* The greedy token and the runner-up, penalised: the greedy pick must move when the penalty is big enough. */
    int32_t best = 0, second = -1;
    for (int32_t v = 1; v < V; v++)
        if (z[v] > z[best]) best = v;
    for (int32_t v = 0; v < V; v++)
        if (v != best && (second < 0 || z[v] > z[second])) second = v;
    int32_t hist[3] = {best, best, second};
    const float cases[4][3] = {{4.0f, 0, 0}, {1, 3.0f, 0}, {1, 0, 2.0f}, {1.5f, 0.5f, 0.25f}};
    for (int c = 0; c < 4; c++) {
        struct runner_sampling sp;
        memset(&sp, 0, sizeof sp);
        sp.top_p = 1.0f;
        sp.repetition_penalty = cases[c][0];
        sp.presence_penalty = cases[c][1];
        sp.frequency_penalty = cases[c][2];
        sp.history = hist;
        sp.n_history = 3;
        sp.n_top = 4;
        memcpy(pz, z, (size_t)V * sizeof *pz);
        penalise(pz, hist, 3, 0, cases[c][0], cases[c][1], cases[c][2], V);
        int32_t want = 0;
        for (int32_t v = 1; v < V; v++)
            if (pz[v] > pz[want]) want = v;
        struct runner_sample_out o;
        int32_t tok;
        uint64_t ctr = 0;
        ck_assert_msg(runner_sample_rows_lp(s.r, row, 1, &sp, &ctr, &tok, &o) == BERTH_OK, "%s", berth_last_error());
        ck_assert_int_eq(tok, want);
        check_lp(pz, V, tok, &o, 4);
        /* The penalty really moved the distribution: the greedy token lost probability. */
        double *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        log_softmax(z, V, a);
        log_softmax(pz, V, b);
        ck_assert_msg(b[best] < a[best] - 1e-3, "case %d: logprob of %d went %g -> %g", c, (int)best, a[best], b[best]);
        free(a), free(b);
    }
    free(z), free(pz);
    g4_close(&s);
    free_prompts(&f);
}
END_TEST

struct lp_outcome {
    int32_t toks[8][GEN];
    struct runner_sample_out lp[8][GEN];
    int32_t n[8];
    int done[8];
    const char *finish[8];
};

static int on_tok(void *arg, int64_t id, int32_t index, int32_t token, const struct runner_sample_out *lp)
{
    struct lp_outcome *o = arg;
    ck_assert(id >= 0 && id < 8 && index == 0 && o->n[id] < GEN);
    ck_assert_ptr_nonnull(lp);
    o->lp[id][o->n[id]] = *lp;
    o->toks[id][o->n[id]++] = token;
    return 0;
}

static void on_done(void *arg, int64_t id, int32_t index, const char *finish, int32_t n_tokens, int32_t cached,
                    berth_status st, const char *msg)
{
    struct lp_outcome *o = arg;
    (void)index, (void)cached;
    ck_assert_msg(st == BERTH_OK, "%s", msg);
    ck_assert_int_eq(n_tokens, o->n[id]);
    o->done[id] = 1;
    o->finish[id] = finish;
}

static struct runner_sampling params(int32_t i)
{
    struct runner_sampling sp;
    memset(&sp, 0, sizeof sp);
    sp.temperature = 0.9f;
    sp.top_p = 0.95f;
    sp.min_p = 0.02f;
    sp.repetition_penalty = i % 2 ? 1.3f : 0.0f;
    sp.presence_penalty = 0.4f;
    sp.frequency_penalty = 0.2f * (float)i;
    sp.seed = 100 + (uint64_t)i;
    sp.n_top = 3;
    return sp;
}

static void run_all(struct scheduler *sc)
{
    for (int guard = 0; sched_pending(sc) > 0; guard++) {
        int did;
        ck_assert_int_lt(guard, 1000);
        ck_assert_msg(sched_step(sc, &did) == BERTH_OK, "%s", berth_last_error());
    }
}

START_TEST(test_seeded_alone_equals_batched)
{
    struct tprompts f;
    load_prompts(&f);
    struct g4_session s;
    open_tiny(&s);
    const int32_t nr = f.n_prompts < 4 ? f.n_prompts : 4;
    /* Alone: runner_generate (no scheduler), the same parameters and history rule. */
    struct runner_generation ref[4];
    for (int32_t i = 0; i < nr; i++) {
        struct runner_gen_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_new = GEN;
        gp.ignore_eos = 1;
        gp.logprobs = 1;
        gp.sampling = params(i);
        ck_assert_msg(runner_generate(s.r, f.prompts[i].ids, f.prompts[i].n, &gp, NULL, NULL, NULL, &ref[i]) ==
                          BERTH_OK, "%s", berth_last_error());
        ck_assert_int_eq(ref[i].n_tokens, GEN);
    }
    g4_close(&s);
    /* Batched: all at once through the scheduler (4 sequences, chunked prefill beside decode rows). */
    struct g4_session b;
    open_seqs(4, &b);
    struct lp_outcome *o = calloc(1, sizeof *o);
    struct sched_callbacks cb = {.on_done = on_done, .arg = o, .on_token_ex = on_tok};
    struct scheduler *sc;
    ck_assert_int_eq(sched_create(b.r, &cb, &sc), BERTH_OK);
    for (int32_t i = 0; i < nr; i++) {
        struct sched_request rq;
        memset(&rq, 0, sizeof rq);
        rq.prompt = f.prompts[i].ids;
        rq.n_prompt = f.prompts[i].n;
        rq.max_new = GEN;
        rq.ignore_eos = 1;
        rq.logprobs = 1;
        rq.sampling = params(i);
        ck_assert_int_eq(sched_add(sc, i, &rq), BERTH_OK);
    }
    run_all(sc);
    ck_assert_int_gt(sched_stats(sc)->mixed_steps, 0);
    for (int32_t i = 0; i < nr; i++) {
        ck_assert(o->done[i]);
        ck_assert_int_eq(o->n[i], GEN);
        for (int32_t k = 0; k < GEN; k++) {
            ck_assert_msg(o->toks[i][k] == ref[i].tokens[k], "request %d token %d: %d batched, %d alone", (int)i,
                          (int)k, (int)o->toks[i][k], (int)ref[i].tokens[k]);
            ck_assert(fabs(o->lp[i][k].logprob - ref[i].logprobs[k].logprob) <= 1e-4);
            ck_assert_int_eq(o->lp[i][k].n_top, 3);
            for (int32_t t = 0; t < 3; t++) ck_assert_int_eq(o->lp[i][k].top_ids[t], ref[i].logprobs[k].top_ids[t]);
        }
        free(ref[i].tokens);
        free(ref[i].logprobs);
    }
    sched_free(sc);
    free(o);
    g4_close(&b);
    free_prompts(&f);
}
END_TEST

/* The history rule of scheduler.h, seen in the first token's logprobs: presence alone ignores the prompt; a
 * repetition penalty counts it. */
START_TEST(test_history_rule)
{
    struct tprompts f;
    load_prompts(&f);
    struct g4_session s;
    open_tiny(&s);
    const struct g4_prompt *p = &f.prompts[0];
    const int32_t V = runner_info(s.r)->vocab_size;
    float *z = malloc((size_t)V * sizeof *z), *pz = malloc((size_t)V * sizeof *pz);
    prefill_last(&s, p, z);
    for (int c = 0; c < 2; c++) {
        struct lp_outcome *o = calloc(1, sizeof *o);
        struct sched_callbacks cb = {.on_done = on_done, .arg = o, .on_token_ex = on_tok};
        struct scheduler *sc;
        ck_assert_int_eq(sched_create(s.r, &cb, &sc), BERTH_OK);
        struct sched_request rq;
        memset(&rq, 0, sizeof rq);
        rq.prompt = p->ids;
        rq.n_prompt = p->n;
        rq.max_new = 1;
        rq.ignore_eos = 1;
        rq.logprobs = 1;
        rq.sampling.top_p = 1.0f;
        if (c == 0)
            rq.sampling.presence_penalty = 5.0f;
        else
            rq.sampling.repetition_penalty = 3.0f;
        ck_assert_int_eq(sched_add(sc, 0, &rq), BERTH_OK);
        run_all(sc);
        memcpy(pz, z, (size_t)V * sizeof *pz);
        if (c == 1) penalise(pz, p->ids, p->n, 0, 3.0f, 0, 0, V);
        ck_assert_int_eq(o->n[0], 1);
        check_lp(pz, V, o->toks[0][0], &o->lp[0][0], 0);
        sched_free(sc);
        free(o);
    }
    free(z), free(pz);
    g4_close(&s);
    free_prompts(&f);
}
END_TEST

/* vLLM's rule through the runner: n_history_prompt leading history ids count for the repetition penalty only
 * (runner_sampling -> the sample op's history_output_start); runner_generate marks the prompt so. */
START_TEST(test_prompt_history_repetition_only)
{
    struct tprompts f;
    load_prompts(&f);
    struct g4_session s;
    open_tiny(&s);
    const struct g4_prompt *p = &f.prompts[0];
    const int32_t V = runner_info(s.r)->vocab_size;
    float *z = malloc((size_t)V * sizeof *z), *pz = malloc((size_t)V * sizeof *pz);
    prefill_last(&s, p, z);
    const int32_t row = runner_n_logits(s.r) - 1;
    int32_t best = 0;
    for (int32_t v = 1; v < V; v++)
        if (z[v] > z[best]) best = v;
    /* history: the prompt, then "generated" best, p->ids[0], p->ids[0] (a prompt id generated again) */
    const int32_t n = p->n + 3;
    int32_t *hist = malloc((size_t)n * sizeof *hist);
    memcpy(hist, p->ids, (size_t)p->n * sizeof *hist);
    hist[p->n] = best, hist[p->n + 1] = hist[p->n + 2] = p->ids[0];
    const float cases[3][3] = {{1.0f, 5.0f, 0.0f}, {1.0f, 0.0f, 2.0f}, {1.5f, 0.5f, 0.25f}};
    for (int c = 0; c < 3; c++) {
        struct runner_sampling sp;
        memset(&sp, 0, sizeof sp);
        sp.top_p = 1.0f;
        sp.repetition_penalty = cases[c][0];
        sp.presence_penalty = cases[c][1];
        sp.frequency_penalty = cases[c][2];
        sp.history = hist;
        sp.n_history = n;
        sp.n_history_prompt = p->n;
        sp.n_top = 4;
        memcpy(pz, z, (size_t)V * sizeof *pz);
        penalise(pz, hist, n, p->n, cases[c][0], cases[c][1], cases[c][2], V);
        int32_t want = 0;
        for (int32_t v = 1; v < V; v++)
            if (pz[v] > pz[want]) want = v;
        struct runner_sample_out o;
        int32_t tok;
        uint64_t ctr = 0;
        ck_assert_msg(runner_sample_rows_lp(s.r, row, 1, &sp, &ctr, &tok, &o) == BERTH_OK, "%s", berth_last_error());
        ck_assert_int_eq(tok, want);
        check_lp(pz, V, tok, &o, 4);
    }
    struct runner_sampling bad;
    memset(&bad, 0, sizeof bad);
    bad.top_p = 1.0f, bad.presence_penalty = 1.0f, bad.history = hist, bad.n_history = 3, bad.n_history_prompt = 4;
    int32_t tok;
    uint64_t ctr = 0;
    ck_assert_int_eq(runner_sample_rows_lp(s.r, row, 1, &bad, &ctr, &tok, NULL), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "row 0: penalty history prompt length 4 must be in 0..3");

    /* runner_generate: the first token's history is the prompt alone, so a presence penalty of 5 changes nothing
     * and only the repetition penalty moves the logits */
    struct runner_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new = 1;
    gp.ignore_eos = 1;
    gp.logprobs = 1;
    gp.sampling.top_p = 1.0f;
    gp.sampling.repetition_penalty = 3.0f;
    gp.sampling.presence_penalty = 5.0f;
    gp.sampling.n_top = 4;
    struct runner_generation g;
    ck_assert_msg(runner_generate(s.r, p->ids, p->n, &gp, NULL, NULL, NULL, &g) == BERTH_OK, "%s",
                  berth_last_error());
    ck_assert_int_eq(g.n_tokens, 1);
    memcpy(pz, z, (size_t)V * sizeof *pz);
    penalise(pz, p->ids, p->n, p->n, 3.0f, 5.0f, 0.0f, V);
    check_lp(pz, V, g.tokens[0], &g.logprobs[0], 4);
    free(g.tokens), free(g.logprobs);
    free(hist), free(z), free(pz);
    g4_close(&s);
    free_prompts(&f);
}
END_TEST

/* ---- engine: stop strings ---- */

struct text_sink {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[64];
    int32_t n, n_done, done_tokens, lp_ok;
    char finish[16];
    char *text;
};

static void on_event(void *arg, const berth_engine_event *ev)
{
    struct text_sink *s = arg;
    pthread_mutex_lock(&s->mu);
    if (ev->kind == BERTH_EVENT_TOKEN) {
        if (s->n < 64) s->toks[s->n++] = ev->token;
        /* greedy with logprobs: the token is the best one */
        if (ev->has_logprob && ev->n_top == 2 && ev->top_ids[0] == ev->token &&
            fabsf(ev->top_logprobs[0] - ev->logprob) == 0.0f && ev->top_logprobs[1] <= ev->logprob)
            s->lp_ok++;
    } else {
        s->done_tokens = ev->n_tokens;
        snprintf(s->finish, sizeof s->finish, "%s", ev->finish_reason);
        s->text = ev->text ? strdup(ev->text) : NULL;
        s->n_done++;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
}

static void run_engine(berth_engine *e, const berth_engine_request *rq, struct text_sink *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    ck_assert_msg(berth_engine_submit(e, rq, on_event, s, NULL) == BERTH_OK, "%s", berth_engine_last_error());
    pthread_mutex_lock(&s->mu);
    while (s->n_done < 1) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

START_TEST(test_stop_strings)
{
    struct tprompts f;
    load_prompts(&f);
    char *cfg = g4_config_path();
    berth_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.config_path = cfg;
    c.model_dir = tiny_dir;
    c.max_seqs = 2;
    c.max_batch_tokens = 8;
    berth_engine *e = NULL;
    ck_assert_msg(berth_engine_create(&c, &e) == BERTH_OK, "%s", berth_engine_last_error());
    berth_tokenizer *tok = NULL;
    ck_assert_int_eq(prompt_tokenizer_open(tiny_dir, 1, &tok), BERTH_OK);

    berth_engine_request rq;
    memset(&rq, 0, sizeof rq);
    rq.struct_size = sizeof rq;
    rq.prompt = f.prompts[0].ids;
    rq.n_prompt = f.prompts[0].n;
    rq.max_new_tokens = 24;
    rq.ignore_eos = 1;
    rq.logprobs = 1;
    rq.top_logprobs = 2;
    struct text_sink full;
    run_engine(e, &rq, &full);
    ck_assert_str_eq(full.finish, "length");
    ck_assert_int_eq(full.n, 24);
    ck_assert_int_eq(full.lp_ok, 24);
    ck_assert_ptr_nonnull(full.text);
    char *whole = NULL;
    ck_assert_int_eq(tok_decode(tok, full.toks, (size_t)full.n, 1, &whole), BERTH_OK);
    ck_assert_str_eq(full.text, whole);
    size_t L = strlen(full.text);
    ck_assert_msg(L >= 6, "greedy text too short to cut: '%s'", full.text);
    /* A stop string from the middle of the output: 3 bytes at the middle, moved to a UTF-8 boundary. */
    size_t at = L / 2;
    while (at > 0 && ((unsigned char)full.text[at] & 0xC0) == 0x80) at--;
    size_t len = 3;
    while (at + len < L && ((unsigned char)full.text[at + len] & 0xC0) == 0x80) len++;
    char stop[64];
    snprintf(stop, sizeof stop, "%.*s", (int)len, full.text + at);
    size_t cut = (size_t)(strstr(full.text, stop) - full.text);
    /* Tokens: the fewest whose decoded text contains the stop string. */
    int32_t want_n = 0;
    for (int32_t k = 1; k <= full.n && !want_n; k++) {
        char *t = NULL;
        ck_assert_int_eq(tok_decode(tok, full.toks, (size_t)k, 1, &t), BERTH_OK);
        if (strstr(t, stop)) want_n = k;
        free(t);
    }
    ck_assert_int_gt(want_n, 0);

    const char *stops[2] = {"\x01never\x02", stop};
    rq.n_stop_strings = 2;
    rq.stop_strings = stops;
    struct text_sink cutrun;
    run_engine(e, &rq, &cutrun);
    ck_assert_str_eq(cutrun.finish, "stop");
    ck_assert_int_eq(cutrun.done_tokens, want_n);
    ck_assert_int_eq(cutrun.n, want_n);
    ck_assert_int_eq(strlen(cutrun.text), cut);
    ck_assert_int_eq(strncmp(cutrun.text, full.text, cut), 0);

    /* Bad stop strings fail at submit. */
    const char *empty[1] = {""};
    rq.n_stop_strings = 1;
    rq.stop_strings = empty;
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &cutrun, NULL), BERTH_E_INVALID);
    ck_assert_str_eq(berth_engine_last_error(), "engine: stop string 0 is empty");
    rq.n_stop_strings = 0;
    rq.top_logprobs = 21;
    ck_assert_int_eq(berth_engine_submit(e, &rq, on_event, &cutrun, NULL), BERTH_E_INVALID);
    ck_assert_str_eq(berth_engine_last_error(), "engine: top_logprobs = 21 must be in 0..20");

    free(whole);
    free(full.text);
    free(cutrun.text);
    tok_free(tok);
    berth_engine_destroy(e);
    free(cfg);
    free_prompts(&f);
}
END_TEST

int main(void)
{
    tiny_dir = g4_join(g4_env("BERTH_SOURCE_ROOT", "."), "tests/fixtures/tiny-gemma4");
    char *probe = g4_join(tiny_dir, "model.safetensors");
    FILE *fp = fopen(probe, "rb");
    free(probe);
    if (!fp) {
        printf("SKIP: no tiny-gemma4 checkpoint\n");
        free(tiny_dir);
        return 77;
    }
    fclose(fp);
    Suite *su = suite_create("engine_sampling");
    TCase *tc = tcase_create("tiny_gemma4");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_logprobs_match_host);
    tcase_add_test(tc, test_penalties_as_specified);
    tcase_add_test(tc, test_history_rule);
    tcase_add_test(tc, test_prompt_history_repetition_only);
    tcase_add_test(tc, test_seeded_alone_equals_batched);
    tcase_add_test(tc, test_stop_strings);
    suite_add_tcase(su, tc);
    const int failed = check_run(su, 0);
    free(tiny_dir);
    return failed ? 1 : 0;
}

/* test_sched_gemma4_batching.c — the scheduler (host/scheduler.c) on every Gemma 4 fixture checkpoint (CPU
 * backend, KV blocks of 4 tokens, max_batch_tokens 8 so prompts are prefilled in chunks beside decode rows):
 *  - greedy outputs of 6 concurrent requests (added in two waves) equal each request run alone, and the
 *    counters show steps that mixed prefill chunks and decode rows;
 *  - seeded sampling gives the same tokens alone and inside a batch;
 *  - a KV budget too small for all requests at once forces preemption (counter > 0) and every request still
 *    completes with the tokens it gets alone;
 *  - n = 4 samples fork one prefilled sequence (forks counter 3, shared blocks) and sample k equals a lone run
 *    with seed + k;
 *  - cancel frees the request's KV at once; a request that alone cannot fit fails when added;
 *  - with every sequence slot taken and requests waiting, decode steps are still chained (overlap variant).
 * Exits 77 while tests/fixtures/gemma4/ holds no checkpoints. */
#include "scheduler.h"
#include "test_gemma4_fixture.h"

#define BLOCK 4
#define GEN 6
#define MAXR 16
#define LONG_GEN 48 /* part 4's two long requests (ids MAXR - 1, MAXR - 2) */
#define LONG_ID (MAXR - 1)

static char **fixture_dirs;
static int n_fixtures;

struct outcome {
    int32_t toks[MAXR][4][LONG_GEN + 1];
    int32_t n[MAXR][4];
    int done[MAXR][4];
    const char *finish[MAXR][4];
};

static void on_token(void *arg, int64_t id, int32_t index, int32_t token)
{
    struct outcome *o = arg;
    ck_assert(id >= 0 && id < MAXR && index >= 0 && index < 4);
    ck_assert_int_lt(o->n[id][index], LONG_GEN + 1);
    o->toks[id][index][o->n[id][index]++] = token;
}

static void on_done(void *arg, int64_t id, int32_t index, const char *finish, int32_t n_tokens, int32_t cached,
                    berth_status st, const char *msg)
{
    struct outcome *o = arg;
    (void)cached;
    ck_assert_msg(st == BERTH_OK, "request %lld failed: %s", (long long)id, msg);
    ck_assert_int_eq(n_tokens, o->n[id][index]);
    o->done[id][index] = 1;
    o->finish[id][index] = finish;
}

/* g4_open with max_seqs and the KV memory chosen by the test. */
static void open_batch(const char *dir, int32_t max_seqs, uint64_t kv_memory, struct g4_session *s)
{
    memset(s, 0, sizeof *s);
    char *cfg_path = g4_config_path();
    ck_assert_msg(config_load(cfg_path, &s->cfg) == BERTH_OK, "%s", berth_last_error());
    free(cfg_path);
    ck_assert_msg(registry_load(s->cfg, &s->reg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(ckpt_open(dir, &s->ck) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(registry_select(s->reg, s->ck, &s->sel) == BERTH_OK, "%s", berth_last_error());
    s->have_sel = 1;
    struct runner_config rc;
    memset(&rc, 0, sizeof rc);
    rc.be = &s->sel.api;
    rc.mvt = s->sel.model_plugin->desc->vtable;
    rc.model = s->sel.model;
    rc.ck = s->ck;
    rc.model_dir = dir;
    rc.max_batch_tokens = 8;
    rc.max_seqs = max_seqs;
    rc.kv_block_size = BLOCK;
    rc.kv_memory = kv_memory ? kv_memory : s->cfg->kv_memory_bytes;
    rc.overlap = s->cfg->sched_overlap; /* the overlap variant's config forces it on (runner.h, "Overlap") */
    ck_assert_msg(runner_create(&rc, &s->r) == BERTH_OK, "%s: %s", dir, berth_last_error());
}

static void alone_n(struct runner *r, const int32_t *ids, int32_t n, float temperature, uint64_t seed,
                    int32_t max_new, int32_t *out)
{
    struct runner_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new = max_new;
    gp.ignore_eos = 1;
    gp.sampling.temperature = temperature;
    gp.sampling.top_p = 1.0f;
    gp.sampling.seed = seed;
    struct runner_generation g;
    ck_assert_msg(runner_generate(r, ids, n, &gp, NULL, NULL, NULL, &g) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(g.n_tokens, max_new);
    memcpy(out, g.tokens, (size_t)max_new * sizeof *out);
    free(g.tokens);
}

static void alone(struct runner *r, const int32_t *ids, int32_t n, float temperature, uint64_t seed, int32_t *out)
{
    alone_n(r, ids, n, temperature, seed, GEN, out);
}

static struct sched_request request(const struct g4_prompt *gp, float temperature, uint64_t seed, int32_t n)
{
    struct sched_request rq;
    memset(&rq, 0, sizeof rq);
    rq.prompt = gp->ids;
    rq.n_prompt = gp->n;
    rq.max_new = GEN;
    rq.n = n;
    rq.ignore_eos = 1;
    rq.sampling.temperature = temperature;
    rq.sampling.top_p = 1.0f;
    rq.sampling.seed = seed;
    return rq;
}

static void run_all(struct scheduler *sc)
{
    for (int guard = 0; sched_pending(sc) > 0; guard++) {
        int did;
        ck_assert_int_lt(guard, 2000);
        ck_assert_msg(sched_step(sc, &did) == BERTH_OK, "%s", berth_last_error());
        ck_assert(did);
    }
}

/* Requests: every prompt greedy, then every prompt seeded (temperature 0.9, seed 17 + i), up to 6. */
static int32_t n_requests(const struct g4_fixture *f) { return f->n_prompts * 2 < 6 ? f->n_prompts * 2 : 6; }
static const struct g4_prompt *req_prompt(const struct g4_fixture *f, int32_t i) { return &f->prompts[i % f->n_prompts]; }
static float req_temp(const struct g4_fixture *f, int32_t i) { return i < f->n_prompts ? 0.0f : 0.9f; }

static void check_against_alone(const struct g4_fixture *f, struct outcome *o, int32_t (*ref)[GEN], int32_t nr)
{
    for (int32_t i = 0; i < nr; i++) {
        ck_assert_msg(o->done[i][0], "%s: request %d did not finish", f->variant, (int)i);
        ck_assert_str_eq(o->finish[i][0], SCHED_FINISH_LENGTH);
        ck_assert_int_eq(o->n[i][0], GEN);
        for (int32_t k = 0; k < GEN; k++)
            ck_assert_msg(o->toks[i][0][k] == ref[i][k], "%s: request %d token %d: %d batched, %d alone", f->variant,
                          (int)i, (int)k, (int)o->toks[i][0][k], (int)ref[i][k]);
    }
}

START_TEST(test_batching)
{
    struct g4_fixture f;
    g4_load_fixture(fixture_dirs[_i], &f);
    struct g4_session one, many;
    g4_open(f.dir, 8, BLOCK, &one);
    const int32_t nr = n_requests(&f);
    int32_t ref[MAXR][GEN];
    for (int32_t i = 0; i < nr; i++)
        alone(one.r, req_prompt(&f, i)->ids, req_prompt(&f, i)->n, req_temp(&f, i), 17 + (uint64_t)i, ref[i]);

    /* 1. Concurrent, default KV budget, two waves. */
    open_batch(f.dir, 4, 0, &many);
    struct outcome *o = calloc(1, sizeof *o);
    struct sched_callbacks cb = {.on_token = on_token, .on_done = on_done, .arg = o};
    struct scheduler *sc;
    ck_assert_int_eq(sched_create(many.r, &cb, &sc), BERTH_OK);
    for (int32_t i = 0; i < nr; i++) {
        struct sched_request rq = request(req_prompt(&f, i), req_temp(&f, i), 17 + (uint64_t)i, 1);
        ck_assert_int_eq(sched_add(sc, i, &rq), BERTH_OK);
        if (i == 1) { /* let the first two start decoding before the rest arrive */
            int did;
            for (int k = 0; k < 4; k++) ck_assert_int_eq(sched_step(sc, &did), BERTH_OK);
        }
    }
    run_all(sc);
    check_against_alone(&f, o, ref, nr);
    const struct sched_stats *st = sched_stats(sc);
    ck_assert_int_gt(st->mixed_steps, 0);
    /* Overlap: decode steps went out before their tokens were read whenever the runner can feed them. */
    if (many.cfg->sched_overlap > 0) ck_assert(runner_can_feed(many.r));
    if (runner_can_feed(many.r))
        ck_assert_int_gt(st->chained_steps, 0);
    else
        ck_assert_int_eq(st->chained_steps, 0);
    ck_assert_int_eq(st->finished, nr);
    ck_assert_int_eq(st->decode_rows, (int64_t)nr * (GEN - 1));
    int64_t prompt_sum = 0;
    for (int32_t i = 0; i < nr; i++) prompt_sum += req_prompt(&f, i)->n;
    if (st->preemptions == 0) {
        ck_assert_int_eq(st->recomputed_tokens, 0);
        ck_assert_int_eq(st->prefill_tokens + st->cached_tokens, prompt_sum);
    }
    struct kv_cache *kv = runner_kv(many.r);
    for (int32_t g = 0; g < kv_n_groups(kv); g++) ck_assert_int_eq(kv_blocks_in_use(kv, g), 0);
    ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "%s", berth_last_error());

    /* 2. n = 4 samples: one prefill, three forks; sample k equals a lone run with seed 5 + k. */
    memset(o, 0, sizeof *o);
    int64_t forks0 = kv_counters(kv)->forks, pre0 = st->prefill_tokens, cached0 = st->cached_tokens;
    const struct g4_prompt *p0 = &f.prompts[0];
    struct sched_request rq = request(p0, 0.9f, 5, 4);
    ck_assert_int_eq(sched_add(sc, 9, &rq), BERTH_OK);
    run_all(sc);
    ck_assert_int_eq(kv_counters(kv)->forks - forks0, 3);
    ck_assert_int_eq(st->prefill_tokens + st->cached_tokens - pre0 - cached0, p0->n);
    for (int32_t k = 0; k < 4; k++) {
        int32_t want[GEN];
        alone(one.r, p0->ids, p0->n, 0.9f, 5 + (uint64_t)k, want);
        ck_assert_int_eq(o->n[9][k], GEN);
        for (int32_t t = 0; t < GEN; t++)
            ck_assert_msg(o->toks[9][k][t] == want[t], "%s: sample %d token %d: %d forked, %d alone", f.variant,
                          (int)k, (int)t, (int)o->toks[9][k][t], (int)want[t]);
    }

    /* 3. Cancel frees at once. */
    memset(o, 0, sizeof *o);
    rq = request(p0, 0.0f, 0, 1);
    ck_assert_int_eq(sched_add(sc, 3, &rq), BERTH_OK);
    int did;
    ck_assert_int_eq(sched_step(sc, &did), BERTH_OK);
    ck_assert_int_gt(kv_blocks_in_use(kv, kv_n_groups(kv) - 1), 0);
    ck_assert_int_eq(sched_cancel(sc, 3), BERTH_OK);
    ck_assert_str_eq(o->finish[3][0], SCHED_FINISH_CANCEL);
    for (int32_t g = 0; g < kv_n_groups(kv); g++) ck_assert_int_eq(kv_blocks_in_use(kv, g), 0);
    ck_assert_int_eq(sched_pending(sc), 0);
    ck_assert_int_eq(sched_cancel(sc, 3), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "no live request has id 3");
    sched_free(sc);
    uint64_t block_bytes = 0;
    for (int32_t g = 0; g < kv_n_groups(kv); g++) block_bytes += kv_block_bytes(kv, g);
    g4_close(&many);

    /* 4. A tight KV budget: the longest request fits alone (plus slack), all together do not. */
    int32_t longest = 0;
    for (int32_t i = 0; i < nr; i++)
        if (req_prompt(&f, i)->n > longest) longest = req_prompt(&f, i)->n;
    int32_t shortest = longest;
    for (int32_t i = 0; i < nr; i++)
        if (req_prompt(&f, i)->n < shortest) shortest = req_prompt(&f, i)->n;
    /* Room for any one request and 3 blocks more, far from two long ones. */
    int32_t w_long = (shortest + LONG_GEN + BLOCK - 1) / BLOCK;
    ck_assert_int_ge(w_long, (longest + GEN + BLOCK - 1) / BLOCK);
    int32_t blocks = w_long + 3;
    open_batch(f.dir, 4, (uint64_t)blocks * block_bytes, &many);
    memset(o, 0, sizeof *o);
    ck_assert_int_eq(sched_create(many.r, &cb, &sc), BERTH_OK);
    /* First two long generations from the shortest prompt, then the rest shortest first. Admission charges a
     * request every block it can touch, but a running request's growth is not reserved (scheduler.h, "Admission"):
     * the second long one is admitted while the first holds only its first blocks, and their growth then needs
     * more than the cache holds, so one is preempted. */
    int32_t order[MAXR];
    for (int32_t i = 0; i < nr; i++) order[i] = i;
    for (int32_t i = 1; i < nr; i++)
        for (int32_t j = i; j > 0 && req_prompt(&f, order[j])->n < req_prompt(&f, order[j - 1])->n; j--) {
            int32_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    const struct g4_prompt *ps = req_prompt(&f, order[0]);
    int32_t long_ref[LONG_GEN];
    alone_n(one.r, ps->ids, ps->n, 0.0f, 0, LONG_GEN, long_ref);
    rq = request(ps, 0.0f, 0, 1);
    rq.max_new = LONG_GEN;
    ck_assert_msg(sched_add(sc, LONG_ID, &rq) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(sched_add(sc, LONG_ID - 1, &rq) == BERTH_OK, "%s", berth_last_error());
    for (int32_t k = 0; k < nr; k++) {
        int32_t i = order[k];
        rq = request(req_prompt(&f, i), req_temp(&f, i), 17 + (uint64_t)i, 1);
        ck_assert_msg(sched_add(sc, i, &rq) == BERTH_OK, "%s", berth_last_error());
    }
    run_all(sc);
    check_against_alone(&f, o, ref, nr);
    for (int32_t id = LONG_ID - 1; id <= LONG_ID; id++) {
        ck_assert_int_eq(o->n[id][0], LONG_GEN);
        for (int32_t k = 0; k < LONG_GEN; k++)
            ck_assert_msg(o->toks[id][0][k] == long_ref[k], "%s: long request %d token %d: %d batched, %d alone",
                          f.variant, (int)id, (int)k, (int)o->toks[id][0][k], (int)long_ref[k]);
    }
    ck_assert_msg(sched_stats(sc)->preemptions > 0, "%s: no preemption with %d blocks", f.variant, (int)blocks);
    /* Recompute is counted apart: prefill_tokens holds each prompt token at most once, plus the one generated token
     * a re-admitted request feeds for the first time. */
    ck_assert_int_gt(sched_stats(sc)->recomputed_tokens, 0);
    ck_assert_int_le(sched_stats(sc)->prefill_tokens, prompt_sum + 2 * ps->n + sched_stats(sc)->preemptions);
    ck_assert_msg(kv_cache_validate(runner_kv(many.r)) == BERTH_OK, "%s", berth_last_error());
    /* A request that alone cannot fit fails at once, naming the group. */
    struct g4_prompt big = *p0;
    big.n = blocks * BLOCK;
    int32_t *ids = calloc((size_t)big.n, sizeof *ids);
    big.ids = ids;
    rq = request(&big, 0.0f, 0, 1);
    ck_assert_int_eq(sched_add(sc, 1, &rq), BERTH_E_DEVICE_OOM);
    ck_assert_ptr_nonnull(strstr(berth_last_error(), "KV blocks of group '"));
    ck_assert_int_eq(sched_pending(sc), 0);
    free(ids);
    sched_free(sc);
    g4_close(&many);

    /* 5. A full house (max_seqs 2, every request queued at once): while requests wait for a sequence slot, the
     *    running two's decode steps are still chained when the runner can feed them; outputs equal alone. */
    open_batch(f.dir, 2, 0, &many);
    memset(o, 0, sizeof *o);
    ck_assert_int_eq(sched_create(many.r, &cb, &sc), BERTH_OK);
    for (int32_t i = 0; i < nr; i++) {
        struct sched_request rq5 = request(req_prompt(&f, i), req_temp(&f, i), 17 + (uint64_t)i, 1);
        ck_assert_int_eq(sched_add(sc, i, &rq5), BERTH_OK);
    }
    int chained_waiting = 0;
    for (int guard = 0; sched_pending(sc) > 0; guard++) {
        ck_assert_int_lt(guard, 2000);
        const int64_t c0 = sched_stats(sc)->chained_steps;
        const int32_t waiting = sched_stats(sc)->waiting;
        ck_assert_msg(sched_step(sc, &did) == BERTH_OK, "%s", berth_last_error());
        if (waiting > 0 && sched_stats(sc)->chained_steps > c0) chained_waiting = 1;
    }
    check_against_alone(&f, o, ref, nr);
    ck_assert_int_eq(chained_waiting, runner_can_feed(many.r) && nr > 2);
    sched_free(sc);
    g4_close(&many);
    g4_close(&one);
    free(o);
    g4_free_fixture(&f);
}
END_TEST

int main(void)
{
    return g4_run_per_fixture("sched_gemma4_batching", test_batching, &fixture_dirs, &n_fixtures);
}

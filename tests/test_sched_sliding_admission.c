/* test_sched_sliding_admission.c — the scheduler's admission charge (host/scheduler.c, scheduler.h "Admission")
 * on the Gemma 4 'tiny' fixture (sliding window 8, KV blocks of 4, max_batch_tokens 8: a sliding sequence holds
 * at most ceil((8 - 1 + 8) / 4) + 1 = 5 blocks):
 *  - a long request (prompt + 200 new tokens, 50+ blocks of the full group) is admitted on a cache whose sliding
 *    group has only the window bound's blocks (a whole-sequence sliding charge could never admit it), generates
 *    the tokens it gets alone, keeps its peak sliding-block use within the bound while the full group grows to
 *    the whole sequence;
 *  - a full group sized for one whole request makes a second one wait for the first to finish instead of being
 *    admitted on its first chunk and preempted later (no preemption), and both still give their lone tokens.
 * Exits 77 while tests/fixtures/gemma4/tiny is absent. */
#include "scheduler.h"
#include "test_gemma4_fixture.h"
#include "check_run.h"

#define BLOCK 4
#define CHUNK 8
#define LONG_GEN 200
#define SHORT_GEN 40

static char *tiny_dir;

struct outcome {
    int32_t toks[2][LONG_GEN];
    int32_t n[2];
    int done[2];
    int64_t first_token_step[2];
    int64_t done_step[2];
    int64_t step;
};

static void on_token(void *arg, int64_t id, int32_t index, int32_t token)
{
    struct outcome *o = arg;
    ck_assert(id >= 0 && id < 2 && index == 0);
    ck_assert_int_lt(o->n[id], LONG_GEN);
    if (o->n[id] == 0) o->first_token_step[id] = o->step;
    o->toks[id][o->n[id]++] = token;
}

static void on_done(void *arg, int64_t id, int32_t index, const char *finish, int32_t n_tokens, int32_t cached,
                    berth_status st, const char *msg)
{
    struct outcome *o = arg;
    (void)index, (void)cached;
    ck_assert_msg(st == BERTH_OK, "request %lld failed: %s", (long long)id, msg);
    ck_assert_str_eq(finish, SCHED_FINISH_LENGTH);
    ck_assert_int_eq(n_tokens, o->n[id]);
    o->done[id] = 1;
    o->done_step[id] = o->step;
}

/* The tiny checkpoint on the CPU backend with max_seqs sequences and kv_memory bytes of KV (0: the config's). */
static void open_tiny(int32_t max_seqs, uint64_t kv_memory, struct g4_session *s)
{
    memset(s, 0, sizeof *s);
    char *cfg_path = g4_config_path();
    ck_assert_msg(config_load(cfg_path, &s->cfg) == BERTH_OK, "%s", berth_last_error());
    free(cfg_path);
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
    rc.max_batch_tokens = CHUNK;
    rc.max_seqs = max_seqs;
    rc.kv_block_size = BLOCK;
    rc.kv_memory = kv_memory ? kv_memory : s->cfg->kv_memory_bytes;
    ck_assert_msg(runner_create(&rc, &s->r) == BERTH_OK, "%s", berth_last_error());
}

static void alone(struct runner *r, const int32_t *ids, int32_t n, int32_t max_new, int32_t *out)
{
    struct runner_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new = max_new;
    gp.ignore_eos = 1;
    struct runner_generation g;
    ck_assert_msg(runner_generate(r, ids, n, &gp, NULL, NULL, NULL, &g) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(g.n_tokens, max_new);
    memcpy(out, g.tokens, (size_t)max_new * sizeof *out);
    free(g.tokens);
}

static struct sched_request greedy(const struct g4_prompt *p, int32_t max_new)
{
    struct sched_request rq;
    memset(&rq, 0, sizeof rq);
    rq.prompt = p->ids;
    rq.n_prompt = p->n;
    rq.max_new = max_new;
    rq.ignore_eos = 1;
    return rq;
}

static void run_all(struct scheduler *sc, struct outcome *o)
{
    for (int guard = 0; sched_pending(sc) > 0; guard++) {
        int did;
        ck_assert_int_lt(guard, 5000);
        o->step++;
        ck_assert_msg(sched_step(sc, &did) == BERTH_OK, "%s", berth_last_error());
        ck_assert_msg(did, "step %lld: requests pending but nothing admitted", (long long)o->step);
    }
}

static int32_t sliding_group(struct kv_cache *kv)
{
    for (int32_t g = 0; g < kv_n_groups(kv); g++)
        if (kv_group_is_sliding(kv, g)) return g;
    return -1;
}

static int32_t full_group(struct kv_cache *kv)
{
    for (int32_t g = 0; g < kv_n_groups(kv); g++)
        if (!kv_group_is_sliding(kv, g)) return g;
    return -1;
}

START_TEST(test_long_generation_bounded_sliding)
{
    struct g4_fixture f;
    g4_load_fixture(tiny_dir, &f);
    const struct g4_prompt *p = &f.prompts[0];
    struct g4_session one, s;
    open_tiny(1, 0, &one);
    int32_t *ref = malloc(LONG_GEN * sizeof *ref);
    alone(one.r, p->ids, p->n, LONG_GEN, ref);

    open_tiny(1, 0, &s);
    struct kv_cache *kv = runner_kv(s.r);
    int32_t gs = sliding_group(kv), gf = full_group(kv);
    ck_assert_int_ge(gs, 0);
    ck_assert_int_ge(gf, 0);
    const int32_t cap = kv_group_seq_cap(kv, gs);
    ck_assert_int_eq(cap, (8 - 1 + CHUNK + BLOCK - 1) / BLOCK + 1);
    /* The sliding pool holds one sequence's bound, far below the whole sequence: only the bounded charge fits. */
    const int32_t whole = (p->n + LONG_GEN + BLOCK - 1) / BLOCK;
    ck_assert_int_eq(kv_blocks_total(kv, gs), cap);
    ck_assert_int_lt(kv_blocks_total(kv, gs), whole);
    ck_assert_int_ge(kv_blocks_total(kv, gf), whole);

    struct outcome *o = calloc(1, sizeof *o);
    struct sched_callbacks cb = {.on_token = on_token, .on_done = on_done, .arg = o};
    struct scheduler *sc;
    ck_assert_int_eq(sched_create(s.r, &cb, &sc), BERTH_OK);
    struct sched_request rq = greedy(p, LONG_GEN);
    ck_assert_msg(sched_add(sc, 0, &rq) == BERTH_OK, "%s", berth_last_error());
    run_all(sc, o);
    ck_assert(o->done[0]);
    ck_assert_int_eq(o->n[0], LONG_GEN);
    for (int32_t k = 0; k < LONG_GEN; k++)
        ck_assert_msg(o->toks[0][k] == ref[k], "token %d: %d scheduled, %d alone", (int)k, (int)o->toks[0][k],
                      (int)ref[k]);
    const struct runner_stats *rs = runner_stats(s.r);
    ck_assert_int_le(rs->kv_peak_blocks[gs], cap);
    ck_assert_int_gt(rs->kv_peak_blocks[gs], 0);
    /* Every position but the last generated token's was written: the full group grew to the whole sequence. */
    ck_assert_int_eq(rs->kv_peak_blocks[gf], (p->n + LONG_GEN - 1 + BLOCK - 1) / BLOCK);
    ck_assert_int_eq(sched_stats(sc)->preemptions, 0);
    ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "%s", berth_last_error());
    sched_free(sc);
    free(o);
    free(ref);
    g4_close(&s);
    g4_close(&one);
    g4_free_fixture(&f);
}
END_TEST

START_TEST(test_whole_charge_waits_instead_of_preempting)
{
    struct g4_fixture f;
    g4_load_fixture(tiny_dir, &f);
    ck_assert_int_ge(f.n_prompts, 3);
    /* Two different prompts (no shared prefix), the first at least two blocks long, with max_new chosen so that
     * both requests touch exactly W full-group blocks. */
    const struct g4_prompt *p[2] = {&f.prompts[1], &f.prompts[2]};
    ck_assert_int_gt(p[0]->n, BLOCK);
    ck_assert_int_ne(p[0]->ids[1], p[1]->ids[1]);
    const int32_t W = (p[1]->n + SHORT_GEN + BLOCK - 1) / BLOCK;
    const int32_t max_new[2] = {W * BLOCK - p[0]->n, W * BLOCK - p[1]->n};
    ck_assert_int_le(max_new[0], LONG_GEN);
    struct g4_session one, s;
    open_tiny(1, 0, &one);
    int32_t ref[2][LONG_GEN];
    for (int i = 0; i < 2; i++) alone(one.r, p[i]->ids, p[i]->n, max_new[i], ref[i]);
    struct kv_cache *kv1 = runner_kv(one.r);
    int32_t gs = sliding_group(kv1), gf = full_group(kv1);
    uint64_t sliding_bytes = 0, full_bytes = 0;
    for (int32_t g = 0; g < kv_n_groups(kv1); g++) {
        if (kv_group_is_sliding(kv1, g))
            sliding_bytes += 2ull * (uint64_t)kv_group_seq_cap(kv1, g) * kv_block_bytes(kv1, g);
        else
            full_bytes += kv_block_bytes(kv1, g);
    }
    /* Full groups: room for one request whole plus one block, never for both at once. */
    const int32_t full_blocks = W + 1;
    open_tiny(2, sliding_bytes + (uint64_t)full_blocks * full_bytes, &s);
    struct kv_cache *kv = runner_kv(s.r);
    ck_assert_int_eq(kv_blocks_total(kv, gf), full_blocks);
    ck_assert_int_eq(kv_blocks_total(kv, gs), 2 * kv_group_seq_cap(kv, gs));

    struct outcome *o = calloc(1, sizeof *o);
    struct sched_callbacks cb = {.on_token = on_token, .on_done = on_done, .arg = o};
    struct scheduler *sc;
    ck_assert_int_eq(sched_create(s.r, &cb, &sc), BERTH_OK);
    for (int i = 0; i < 2; i++) {
        struct sched_request rq = greedy(p[i], max_new[i]);
        ck_assert_msg(sched_add(sc, i, &rq) == BERTH_OK, "%s", berth_last_error());
    }
    run_all(sc, o);
    for (int i = 0; i < 2; i++) {
        ck_assert(o->done[i]);
        ck_assert_int_eq(o->n[i], max_new[i]);
        for (int32_t k = 0; k < max_new[i]; k++)
            ck_assert_msg(o->toks[i][k] == ref[i][k], "request %d token %d: %d scheduled, %d alone", i, (int)k,
                          (int)o->toks[i][k], (int)ref[i][k]);
    }
    /* The second request was admitted only once the first had given its blocks back: no preemption. */
    ck_assert_int_eq(sched_stats(sc)->preemptions, 0);
    ck_assert_int_eq(sched_stats(sc)->recomputed_tokens, 0);
    ck_assert_int_gt(o->first_token_step[1], o->done_step[0]);
    ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "%s", berth_last_error());
    sched_free(sc);
    free(o);
    g4_close(&s);
    g4_close(&one);
    g4_free_fixture(&f);
}
END_TEST

int main(void)
{
    char *root = g4_fixture_root();
    tiny_dir = g4_join(root, "tiny");
    free(root);
    char *ref = g4_join(tiny_dir, "reference.json");
    struct stat sb;
    int have = stat(ref, &sb) == 0;
    free(ref);
    if (!have) {
        printf("SKIP: no Gemma 4 'tiny' fixture\n");
        free(tiny_dir);
        return 77;
    }
    Suite *su = suite_create("sched_sliding_admission");
    TCase *tc = tcase_create("tiny");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_long_generation_bounded_sliding);
    tcase_add_test(tc, test_whole_charge_waits_instead_of_preempting);
    suite_add_tcase(su, tc);
    const int failed = check_run(su, 0);
    free(tiny_dir);
    return failed ? 1 : 0;
}

/* test_prefix_gemma4_reuse.c — the prefix cache on every Gemma 4 fixture checkpoint (CPU backend, KV blocks of
 * 4 tokens, so sliding-window groups release and the hit rule for them is exercised):
 *  - a request whose prompt extends a finished one (its prompt + its generated tokens + one more) reports the
 *    cached tokens (whole blocks, up to all but the last token), the prefill counter grows by only the uncached
 *    tokens, and its greedy tokens equal those of a run on a fresh runner (no cache);
 *  - the logits of the uncached rows after a prefix hit equal the same rows of a full prefill (max abs <= 1e-4);
 *  - repeating the identical prompt hits too and gives the identical tokens.
 * Exits 77 while tests/fixtures/gemma4/ holds no checkpoints. */
#include "test_gemma4_fixture.h"

#define BLOCK 4
#define GEN 8

static char **fixture_dirs;
static int n_fixtures;

static void generate(struct runner *r, const int32_t *ids, int32_t n, struct runner_generation *out)
{
    struct runner_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new = GEN;
    gp.ignore_eos = 1;
    ck_assert_msg(runner_generate(r, ids, n, &gp, NULL, NULL, NULL, out) == BERTH_OK, "%s", berth_last_error());
}

START_TEST(test_prefix_reuse)
{
    struct g4_fixture f;
    g4_load_fixture(fixture_dirs[_i], &f);
    const int64_t V = f.vocab;
    struct g4_session s, fresh;
    g4_open(f.dir, 0, BLOCK, &s);
    g4_open(f.dir, 0, BLOCK, &fresh);
    int64_t total_hits = 0;
    for (int32_t p = 0; p < f.n_prompts; p++) {
        const struct g4_prompt *gp = &f.prompts[p];
        struct runner_generation g1, g2, g3, ref;
        generate(s.r, gp->ids, gp->n, &g1);
        /* The follow-up: prompt + the 8 generated tokens + one more token. */
        int32_t L = gp->n + g1.n_tokens + 1;
        int32_t *S = malloc((size_t)L * sizeof *S);
        memcpy(S, gp->ids, (size_t)gp->n * sizeof *S);
        memcpy(S + gp->n, g1.tokens, (size_t)g1.n_tokens * sizeof *S);
        S[L - 1] = gp->ids[0];

        const struct runner_stats *st = runner_stats(s.r);
        int64_t pre0 = st->prefill_tokens, hit0 = kv_counters(runner_kv(s.r))->hit_tokens;
        generate(s.r, S, L, &g2);
        int32_t expect_max = (L - 1) / BLOCK * BLOCK;
        ck_assert_msg(g2.cached_tokens > 0 && g2.cached_tokens % BLOCK == 0 && g2.cached_tokens <= expect_max,
                      "%s prompt %d: cached_tokens %d of %d", f.variant, (int)p, (int)g2.cached_tokens, (int)L);
        ck_assert_int_eq(st->prefill_tokens - pre0, L - g2.cached_tokens);
        ck_assert_int_eq(kv_counters(runner_kv(s.r))->hit_tokens - hit0, g2.cached_tokens);
        generate(fresh.r, S, L, &ref);
        ck_assert_int_eq(ref.cached_tokens, 0);
        ck_assert_int_eq(g2.n_tokens, ref.n_tokens);
        for (int32_t i = 0; i < ref.n_tokens; i++)
            ck_assert_msg(g2.tokens[i] == ref.tokens[i], "%s prompt %d: token %d is %d with the prefix cache, %d "
                          "without", f.variant, (int)p, (int)i, (int)g2.tokens[i], (int)ref.tokens[i]);
        total_hits += g2.cached_tokens;

        /* Logits of the rows computed after a hit equal a full prefill's. */
        float *full = malloc((size_t)(L * V) * sizeof(float));
        int32_t seq, cached;
        ck_assert_int_eq(runner_seq_new(fresh.r, &seq), BERTH_OK);
        ck_assert_msg(runner_prefill(fresh.r, seq, S, L, 1, full) == BERTH_OK, "%s", berth_last_error());
        runner_seq_free(fresh.r, seq);
        ck_assert_int_eq(runner_seq_new(s.r, &seq), BERTH_OK);
        ck_assert_int_eq(runner_seq_attach_prefix(s.r, seq, S, L, &cached), BERTH_OK);
        ck_assert_int_gt(cached, 0);
        float *rest = malloc((size_t)((L - cached) * V) * sizeof(float));
        ck_assert_msg(runner_prefill(s.r, seq, S + cached, L - cached, 1, rest) == BERTH_OK, "%s",
                      berth_last_error());
        size_t where;
        double m = g4_max_abs(rest, full + (int64_t)cached * V, (size_t)((L - cached) * V), &where);
        ck_assert_msg(m <= G4_TOL, "%s prompt %d: rows %d.. after a %d-token hit differ by %.3g", f.variant, (int)p,
                      (int)cached, (int)cached, m);
        ck_assert_msg(kv_cache_validate(runner_kv(s.r)) == BERTH_OK, "%s", berth_last_error());
        runner_seq_free(s.r, seq);

        /* The identical prompt again. */
        generate(s.r, gp->ids, gp->n, &g3);
        ck_assert_int_eq(g3.cached_tokens, (gp->n - 1) / BLOCK * BLOCK);
        ck_assert_int_eq(g3.n_tokens, g1.n_tokens);
        ck_assert_int_eq(memcmp(g3.tokens, g1.tokens, (size_t)g1.n_tokens * sizeof(int32_t)), 0);
        free(full);
        free(rest);
        free(S);
        free(g1.tokens);
        free(g2.tokens);
        free(g3.tokens);
        free(ref.tokens);
    }
    ck_assert_int_gt(total_hits, 0);
    g4_close(&fresh);
    g4_close(&s);
    g4_free_fixture(&f);
}
END_TEST

int main(void)
{
    return g4_run_per_fixture("prefix_gemma4_reuse", test_prefix_reuse, &fixture_dirs, &n_fixtures);
}

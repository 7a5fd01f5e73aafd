/* test_gemma4_decode_matches_prefill.c — on every Gemma 4 fixture checkpoint (CPU backend), for every prompt,
 * with the sequence S = prompt + reference continuation (N + k tokens):
 *  - prefill of N tokens, then k single-token decode steps through the paged KV cache, gives the same logits
 *    (max abs <= 1e-4) at every position as one prefill of all N + k tokens;
 *  - the host's and the plugin's counters show exactly N prefill tokens, k decode steps and 1 + k forward calls
 *    for it (no re-prefill);
 *  - a chunked prefill (max_batch_tokens 5) of S matches the one-shot prefill too.
 * KV blocks of 4 tokens, so the sliding-window groups release blocks along the way. Needs no reference logits,
 * only the checkpoints; exits 77 while tests/fixtures/gemma4/ holds none. */
#include "test_gemma4_fixture.h"

#define BLOCK 4
#define CHUNK 5

static char **fixture_dirs;
static int n_fixtures;

static void compare(const char *variant, const char *what, const float *got, const float *ref, int64_t rows,
                    int64_t vocab)
{
    size_t where;
    double m = g4_max_abs(got, ref, (size_t)(rows * vocab), &where);
    ck_assert_msg(m <= G4_TOL, "%s: %s: max |diff| = %.3g at position %lld, id %lld", variant, what, m,
                  (long long)((int64_t)where / vocab), (long long)((int64_t)where % vocab));
}

START_TEST(test_decode_vs_prefill)
{
    struct g4_fixture f;
    g4_load_fixture(fixture_dirs[_i], &f);
    const int64_t V = f.vocab;
    struct g4_session s, sc;
    g4_open(f.dir, 0, BLOCK, &s);
    g4_open(f.dir, CHUNK, BLOCK, &sc);
    for (int32_t p = 0; p < f.n_prompts; p++) {
        const struct g4_prompt *gp = &f.prompts[p];
        const int32_t N = gp->n, k = gp->n_greedy, L = N + k;
        int32_t *S = malloc((size_t)L * sizeof *S);
        memcpy(S, gp->ids, (size_t)N * sizeof *S);
        memcpy(S + N, gp->greedy, (size_t)k * sizeof *S);
        float *once = malloc((size_t)(L * V) * sizeof(float));
        float *stepped = malloc((size_t)(L * V) * sizeof(float));
        float *chunked = malloc((size_t)(L * V) * sizeof(float));
        char what[160];

        int32_t seq;
        ck_assert_int_eq(runner_seq_new(s.r, &seq), BERTH_OK);
        ck_assert_msg(runner_prefill(s.r, seq, S, L, 1, once) == BERTH_OK, "%s", berth_last_error());
        runner_seq_free(s.r, seq);

        const struct runner_stats *st = runner_stats(s.r);
        int64_t pre0 = st->prefill_tokens, dec0 = st->decode_steps, fwd0 = st->forward_calls, rep0 = st->graph_replays;
        int64_t p_pre0 = g4_model_counter(s.r, "prefill_tokens"), p_dec0 = g4_model_counter(s.r, "decode_steps"),
                p_fwd0 = g4_model_counter(s.r, "forward_calls");
        ck_assert_int_eq(runner_seq_new(s.r, &seq), BERTH_OK);
        ck_assert_msg(runner_prefill(s.r, seq, S, N, 1, stepped) == BERTH_OK, "%s", berth_last_error());
        for (int32_t i = 0; i < k; i++) {
            ck_assert_msg(runner_decode(s.r, seq, S[N + i], stepped + (int64_t)(N + i) * V) == BERTH_OK,
                          "%s decode %d: %s", f.variant, (int)i, berth_last_error());
            ck_assert_msg(kv_cache_validate(runner_kv(s.r)) == BERTH_OK, "%s", berth_last_error());
        }
        snprintf(what, sizeof what, "prompt %d: prefill %d + decode %d vs prefill %d", (int)p, (int)N, (int)k, (int)L);
        compare(f.variant, what, stepped, once, L, V);
        ck_assert_int_eq(st->prefill_tokens - pre0, N);
        ck_assert_int_eq(st->decode_steps - dec0, k);
        /* Steps replayed from a recorded decode graph (backends with graphs) do not call forward(). */
        const int64_t replays = st->graph_replays - rep0;
        ck_assert_int_eq(st->forward_calls - fwd0 + replays, 1 + k);
        if (p_pre0 >= 0) ck_assert_int_eq(g4_model_counter(s.r, "prefill_tokens") - p_pre0, N);
        if (p_dec0 >= 0) ck_assert_int_eq(g4_model_counter(s.r, "decode_steps") - p_dec0 + replays, k);
        if (p_fwd0 >= 0) ck_assert_int_eq(g4_model_counter(s.r, "forward_calls") - p_fwd0 + replays, 1 + k);
        /* Full-attention groups hold the whole sequence, sliding ones no more (their bound: validate above). */
        struct kv_cache *kv = runner_kv(s.r);
        for (int32_t g = 0; g < kv_n_groups(kv); g++)
            ck_assert_int_le(kv_blocks_in_use(kv, g), (L + BLOCK - 1) / BLOCK);
        runner_seq_free(s.r, seq);
        for (int32_t g = 0; g < kv_n_groups(kv); g++) ck_assert_int_eq(kv_blocks_in_use(kv, g), 0);

        int64_t cf0 = runner_stats(sc.r)->forward_calls;
        ck_assert_int_eq(runner_seq_new(sc.r, &seq), BERTH_OK);
        ck_assert_msg(runner_prefill(sc.r, seq, S, L, 1, chunked) == BERTH_OK, "%s", berth_last_error());
        ck_assert_int_eq(runner_stats(sc.r)->forward_calls - cf0, (L + CHUNK - 1) / CHUNK);
        snprintf(what, sizeof what, "prompt %d: prefill of %d in chunks of %d vs at once", (int)p, (int)L, CHUNK);
        compare(f.variant, what, chunked, once, L, V);
        runner_seq_free(sc.r, seq);
        free(S);
        free(once);
        free(stepped);
        free(chunked);
    }
    g4_close(&sc);
    g4_close(&s);
    g4_free_fixture(&f);
}
END_TEST

int main(void)
{
    return g4_run_per_fixture("gemma4_decode_matches_prefill", test_decode_vs_prefill, &fixture_dirs, &n_fixtures);
}

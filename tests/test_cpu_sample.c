/*
 * test_cpu_sample.c — CPU backend plugin: log_softmax_topk and sample (reference sampler, determinism, distribution).
 * Harness and conventions: test_cpu_harness.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_cpu_harness.h"

/* ---------------------------------------------------------------------------------------------------------------
 * log_softmax_topk */

struct scored {
    double v;
    int32_t id;
};
static int by_score_desc(const void *a, const void *b)
{
    const struct scored *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

START_TEST(test_log_softmax_topk)
{
    const int64_t V = 1001, R = 3;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const int32_t k = with_bias ? 7 : 1;
        struct tt logits = tt_new(BERTH_DTYPE_F32, V, R, 1, 1, with_bias);
        struct tt bias = tt_new(BERTH_DTYPE_F32, R, 1, 1, 1, 0);
        struct tt vals = tt_new(BERTH_DTYPE_F32, k, R, 1, 1, 1), idx = tt_new(BERTH_DTYPE_I32, k, R, 1, 1, 0);
        trand(&logits.t, -5, 5);
        trand(&bias.t, -3, 0);
        for (int64_t r = 0; r < R; r++) { /* a tie at the top: lower index first */
            tset(&logits.t, 500, r, 0, 0, 6.5);
            tset(&logits.t, 10 + r, r, 0, 0, 6.5);
        }
        tpoison(&vals.t);
        FOR_EACH(&idx.t, a, b, c, d) tset(&idx.t, a, b, c, d, -99);
        berth_log_softmax_topk_params p = {.struct_size = sizeof p, .k = k, .logits = logits.t,
                                           .row_bias = with_bias ? bias.t : absent, .values = vals.t, .indices = idx.t};
        ck_assert_int_eq(vt->supports(be, BERTH_OP_LOG_SOFTMAX_TOPK, &p), BERTH_OK);
        CHECK(ops->log_softmax_topk(be, st, &p) == BERTH_OK, "%s", g_last_error);
        struct scored *s = malloc(sizeof *s * (size_t)V);
        for (int64_t r = 0; r < R; r++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < V; i++)
                mx = fmax(mx, tget(&logits.t, i, r, 0, 0));
            for (int64_t i = 0; i < V; i++)
                sum += exp(tget(&logits.t, i, r, 0, 0) - mx);
            const double b = with_bias ? tget(&bias.t, r, 0, 0, 0) : 0;
            for (int64_t i = 0; i < V; i++) {
                s[i].v = tget(&logits.t, i, r, 0, 0) - mx - log(sum) + b;
                s[i].id = (int32_t)i;
            }
            qsort(s, (size_t)V, sizeof *s, by_score_desc);
            ck_assert_int_eq((int)tget(&idx.t, 0, r, 0, 0), (int)(10 + r)); /* tie: lower index first */
            for (int32_t j = 0; j < k; j++) {
                CHECK((int)tget(&idx.t, j, r, 0, 0) == s[j].id, "log_softmax_topk row %" PRId64 " rank %d: id %d, expected %d",
                      r, j, (int)tget(&idx.t, j, r, 0, 0), s[j].id);
                check_close(tget(&vals.t, j, r, 0, 0), s[j].v, fabs(s[j].v) + 1, 2e-6, "log_softmax_topk value", j, r,
                            0, 0);
            }
        }
        free(s);
        tt_free(&logits);
        tt_free(&bias);
        tt_free(&vals);
        tt_free(&idx);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * sample: a reference sampler (full sort, double) and the generator it shares with the plugin by specification. */

static void ref_philox(uint32_t c[4], uint32_t k0, uint32_t k1)
{
    for (int i = 0; i < 10; i++) {
        const uint64_t a = (uint64_t)0xD2511F53u * c[0], b = (uint64_t)0xCD9E8D57u * c[2];
        const uint32_t n0 = (uint32_t)(b >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(a >> 32) ^ c[3] ^ k1;
        c[1] = (uint32_t)b;
        c[3] = (uint32_t)a;
        c[0] = n0;
        c[2] = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}
static double ref_uniform(uint64_t seed, uint64_t counter)
{
    uint32_t c[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), 0, 0};
    ref_philox(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (double)((((uint64_t)c[0] << 32) | c[1]) >> 11) * 0x1p-53;
}

START_TEST(test_philox_known_answers)
{
    /* Random123's published known-answer vectors for philox4x32-10 */
    uint32_t c[4] = {0, 0, 0, 0};
    ref_philox(c, 0, 0);
    ck_assert_uint_eq(c[0], 0x6627e8d5u);
    ck_assert_uint_eq(c[1], 0xe169c58du);
    ck_assert_uint_eq(c[2], 0xbc57ac4cu);
    ck_assert_uint_eq(c[3], 0x9b00dbd8u);
    uint32_t d[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    ref_philox(d, 0xa4093822u, 0x299f31d0u);
    ck_assert_uint_eq(d[0], 0xd16cfe09u);
    ck_assert_uint_eq(d[1], 0x94fdccebu);
    ck_assert_uint_eq(d[2], 0x5001e420u);
    ck_assert_uint_eq(d[3], 0x24126ea1u);
}
END_TEST

struct row_params {
    float temperature, top_p, min_p, rep, pres, freq;
    int32_t top_k;
    uint64_t seed, counter;
};

/* Reference token for one row; *ambiguous when a float-vs-double difference could flip the choice. */
static int32_t ref_sample(const float *logits, int64_t V, const struct row_params *rp, const int32_t *hist, int32_t nh,
                          double *z, int *ambiguous)
{
    *ambiguous = 0;
    for (int64_t i = 0; i < V; i++)
        z[i] = logits[i];
    int32_t *cnt = calloc((size_t)V, sizeof *cnt);
    for (int32_t i = 0; i < nh; i++)
        cnt[hist[i]]++;
    for (int64_t i = 0; i < V; i++)
        if (cnt[i]) {
            if (rp->rep != 1.0f)
                z[i] = z[i] > 0 ? z[i] / rp->rep : z[i] * rp->rep;
            z[i] -= rp->pres + rp->freq * cnt[i];
        }
    free(cnt);
    if (rp->temperature <= 0) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (z[i] > z[best])
                best = i;
        return best;
    }
    struct scored *o = malloc(sizeof *o * (size_t)V);
    for (int64_t i = 0; i < V; i++) {
        o[i].v = z[i] / rp->temperature;
        o[i].id = (int32_t)i;
    }
    qsort(o, (size_t)V, sizeof *o, by_score_desc);
    int64_t n = rp->top_k > 0 && rp->top_k < V ? rp->top_k : V;
    double S = 0;
    const double wmax = o[0].v;
    for (int64_t i = 0; i < n; i++)
        S += exp(o[i].v - wmax);
    for (int64_t i = 0; i < n; i++)
        o[i].v = exp(o[i].v - wmax) / S; /* now probabilities, still best first */
    if (rp->top_p < 1.0f) {
        double cum = 0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            cum += o[i].v;
            if (fabs(cum - rp->top_p) < 1e-5)
                *ambiguous = 1;
            if (cum >= rp->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    const double floor_p = rp->min_p > 0 ? rp->min_p * o[0].v : -1;
    double *pid = calloc((size_t)V, sizeof *pid); /* survivors' probabilities by id, 0 = not kept */
    for (int64_t i = 0; i < n; i++) {
        if (fabs(o[i].v - floor_p) < 1e-6 * o[0].v)
            *ambiguous = 1;
        if (o[i].v >= floor_p)
            pid[o[i].id] = o[i].v;
    }
    double total = 0;
    for (int64_t i = 0; i < V; i++)
        total += pid[i];
    const double target = ref_uniform(rp->seed, rp->counter) * total;
    double cum = 0;
    int32_t pick = -1;
    for (int32_t i = 0; i < V; i++) {
        if (pid[i] == 0)
            continue;
        cum += pid[i];
        if (fabs(cum - target) < 1e-5 * total)
            *ambiguous = 1;
        if (pick < 0 && cum > target)
            pick = i;
    }
    free(pid);
    free(o);
    return pick;
}

/* Run the plugin's sample on R rows. */
struct sample_run {
    struct tt logits, ids, lp, tids, tlp;
};
static void run_sample_out(struct sample_run *s, const struct row_params *rp, int32_t R, int32_t n_top,
                           const int32_t *hist, const int32_t *hstart, const int32_t *out_start);
static void run_sample(struct sample_run *s, const struct row_params *rp, int32_t R, int32_t n_top,
                       const int32_t *hist, const int32_t *hstart)
{
    run_sample_out(s, rp, R, n_top, hist, hstart, NULL);
}
/* The same with history_output_start (NULL: the whole history is output). */
static void run_sample_out(struct sample_run *s, const struct row_params *rp, int32_t R, int32_t n_top,
                           const int32_t *hist, const int32_t *hstart, const int32_t *out_start)
{
    float temp[64], top_p[64], min_p[64], rep[64], pres[64], freq[64];
    int32_t top_k[64];
    uint64_t seed[64], counter[64];
    for (int32_t r = 0; r < R; r++) {
        temp[r] = rp[r].temperature;
        top_p[r] = rp[r].top_p;
        min_p[r] = rp[r].min_p;
        rep[r] = rp[r].rep;
        pres[r] = rp[r].pres;
        freq[r] = rp[r].freq;
        top_k[r] = rp[r].top_k;
        seed[r] = rp[r].seed;
        counter[r] = rp[r].counter;
    }
    tpoison(&s->lp.t);
    tpoison(&s->tlp.t);
    FOR_EACH(&s->ids.t, a, b, c, d) tset(&s->ids.t, a, b, c, d, -99);
    berth_sample_params p = {.struct_size = sizeof p, .n_rows = R, .n_top = n_top, .temperature = temp,
                             .top_k = top_k, .top_p = top_p, .min_p = min_p, .repetition_penalty = rep,
                             .presence_penalty = pres, .frequency_penalty = freq, .seed = seed, .counter = counter,
                             .history = hist, .history_start = hstart, .logits = s->logits.t, .ids = s->ids.t,
                             .logprob = s->lp.t, .top_ids = n_top ? s->tids.t : absent,
                             .top_logprobs = n_top ? s->tlp.t : absent, .history_output_start = out_start};
    ck_assert_msg(vt->supports(be, BERTH_OP_SAMPLE, &p) == BERTH_OK, "supports: %s", g_last_error);
    CHECK(ops->sample(be, st, &p) == BERTH_OK, "sample: %s", g_last_error);
}
static struct sample_run sample_run_new(int64_t V, int32_t R, int32_t n_top)
{
    struct sample_run s;
    s.logits = tt_new(BERTH_DTYPE_F32, V, R, 1, 1, 1);
    s.ids = tt_new(BERTH_DTYPE_I32, R, 1, 1, 1, 0);
    s.lp = tt_new(BERTH_DTYPE_F32, R, 1, 1, 1, 0);
    s.tids = tt_new(BERTH_DTYPE_I32, n_top ? n_top : 1, R, 1, 1, 0);
    s.tlp = tt_new(BERTH_DTYPE_F32, n_top ? n_top : 1, R, 1, 1, 1);
    return s;
}
static void sample_run_free(struct sample_run *s)
{
    tt_free(&s->logits);
    tt_free(&s->ids);
    tt_free(&s->lp);
    tt_free(&s->tids);
    tt_free(&s->tlp);
}

START_TEST(test_sample_reference)
{
    const int64_t V = 3001;
    const int32_t R = 12, n_top = 4;
    struct sample_run s = sample_run_new(V, R, n_top);
    double *z = malloc(sizeof(double) * (size_t)V);
    float *row = malloc(sizeof(float) * (size_t)V);
    int checked = 0;
    for (int round = 0; round < 8; round++) {
        trand(&s.logits.t, -4, 4);
        struct row_params rp[12];
        int32_t hist[12 * 6], hstart[13];
        for (int32_t r = 0; r < R; r++) {
            rp[r] = (struct row_params){.temperature = (float)urand(0.3, 1.5), .top_p = 1, .min_p = 0, .rep = 1,
                                        .pres = 0, .freq = 0, .top_k = 0, .seed = rng_next(), .counter = rng_next()};
            switch ((r + round) % 6) {
            case 0: break;                                             /* plain temperature */
            case 1: rp[r].top_k = irand(1, 40); break;
            case 2: rp[r].top_p = (float)urand(0.05, 0.95); break;     /* nucleus over the whole vocabulary */
            case 3: rp[r].min_p = (float)urand(0.01, 0.5); break;
            case 4: rp[r].top_k = irand(5, 200); rp[r].top_p = (float)urand(0.3, 0.9); rp[r].min_p = 0.05f; break;
            case 5: rp[r].temperature = 0; break;                      /* greedy */
            }
            if (r % 3 == 1) { /* penalties */
                rp[r].rep = (float)urand(1.1, 2);
                rp[r].pres = (float)urand(0, 1);
                rp[r].freq = (float)urand(0, 0.5);
            }
            hstart[r] = r * 6;
            for (int i = 0; i < 6; i++)
                hist[r * 6 + i] = i < 2 ? irand(0, 5) : irand(0, (int)V - 1); /* repeats */
        }
        hstart[R] = R * 6;
        run_sample(&s, rp, R, n_top, hist, hstart);
        for (int32_t r = 0; r < R; r++) {
            for (int64_t i = 0; i < V; i++)
                row[i] = (float)tget(&s.logits.t, i, r, 0, 0);
            int amb;
            const int32_t ref = ref_sample(row, V, &rp[r], hist + hstart[r], 6, z, &amb);
            const int32_t got = (int32_t)tget(&s.ids.t, r, 0, 0, 0);
            if (!amb) {
                CHECK(got == ref, "sample round %d row %d (temp %g top_k %d top_p %g min_p %g rep %g): id %d, reference %d",
                      round, r, (double)rp[r].temperature, rp[r].top_k, (double)rp[r].top_p, (double)rp[r].min_p,
                      (double)rp[r].rep, got, ref);
                checked++;
            }
            /* logprobs: penalised, temperature-free log-softmax (z holds the penalised logits) */
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < V; i++)
                mx = fmax(mx, z[i]);
            for (int64_t i = 0; i < V; i++)
                sum += exp(z[i] - mx);
            const double lse = mx + log(sum);
            check_close(tget(&s.lp.t, r, 0, 0, 0), z[got] - lse, fabs(z[got] - lse) + 1, 2e-6, "sample logprob", r, 0, 0, 0);
            struct scored *o = malloc(sizeof *o * (size_t)V);
            for (int64_t i = 0; i < V; i++) {
                o[i].v = z[i];
                o[i].id = (int32_t)i;
            }
            qsort(o, (size_t)V, sizeof *o, by_score_desc);
            for (int32_t j = 0; j < n_top; j++) {
                CHECK((int32_t)tget(&s.tids.t, j, r, 0, 0) == o[j].id, "top_ids row %d rank %d: %d, expected %d", r, j,
                      (int)tget(&s.tids.t, j, r, 0, 0), o[j].id);
                check_close(tget(&s.tlp.t, j, r, 0, 0), o[j].v - lse, fabs(o[j].v - lse) + 1, 2e-6, "top_logprobs", j, r,
                            0, 0);
            }
            free(o);
        }
    }
    CHECK(checked >= 80, "only %d unambiguous draws", checked);
    free(z);
    free(row);
    sample_run_free(&s);
}
END_TEST

START_TEST(test_sample_greedy_and_top1)
{
    const int64_t V = 777;
    struct sample_run s = sample_run_new(V, 3, 0);
    trand(&s.logits.t, -3, 3);
    for (int r = 0; r < 3; r++) { /* tie for the max: lower id wins */
        tset(&s.logits.t, 40 + r, r, 0, 0, 9.0);
        tset(&s.logits.t, 600, r, 0, 0, 9.0);
    }
    struct row_params rp[3];
    for (int r = 0; r < 3; r++)
        rp[r] = (struct row_params){.temperature = 0, .top_p = 1, .rep = 1, .seed = rng_next(), .counter = (uint64_t)r};
    rp[1].temperature = -1; /* <= 0 is greedy */
    rp[2].temperature = 1.3f;
    rp[2].top_k = 1; /* top-k 1 is argmax at any temperature */
    run_sample(&s, rp, 3, 0, NULL, NULL);
    for (int r = 0; r < 3; r++)
        ck_assert_int_eq((int)tget(&s.ids.t, r, 0, 0, 0), 40 + r);
    /* a repetition penalty on the winner moves greedy to the other maximum */
    const int32_t hist[2] = {40, 40}, hstart[4] = {0, 2, 2, 2};
    rp[0].rep = 1.5f;
    run_sample(&s, rp, 3, 0, hist, hstart);
    ck_assert_int_eq((int)tget(&s.ids.t, 0, 0, 0, 0), 600);
    sample_run_free(&s);
}
END_TEST

/* Row values nothing can be sampled with are refused before any work, with the messages the CUDA backend gives
 * too (the check is shared): min_p > 1 leaves no id to draw (this op used to return id -1), NaN parameters. */
START_TEST(test_sample_refuses_unusable_rows)
{
    const int64_t V = 50;
    struct sample_run s = sample_run_new(V, 2, 0);
    trand(&s.logits.t, -3, 3);
    static const struct {
        int field; /* 0 min_p, 1 temperature, 2 top_p, 3 presence, 4 frequency */
        float value;
        const char *msg;
    } bad[] = {{0, 1.5f, "sample: row 1 min_p 1.5 must be <= 1"},
               {0, NAN, "sample: row 1 min_p nan must be <= 1"},
               {1, NAN, "sample: row 1 temperature is NaN"},
               {2, NAN, "sample: row 1 top_p is NaN"},
               {3, NAN, "sample: row 1 presence_penalty is NaN"},
               {4, NAN, "sample: row 1 frequency_penalty is NaN"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        float temp[2] = {1, 1}, top_p[2] = {1, 1}, min_p[2] = {0, 0}, pres[2] = {0, 0}, freq[2] = {0, 0};
        float *f[5] = {min_p, temp, top_p, pres, freq};
        f[bad[i].field][1] = bad[i].value;
        berth_sample_params p = {.struct_size = sizeof p, .n_rows = 2, .temperature = temp, .top_p = top_p,
                                 .min_p = min_p, .presence_penalty = pres, .frequency_penalty = freq,
                                 .logits = s.logits.t, .ids = s.ids.t, .logprob = absent, .top_ids = absent,
                                 .top_logprobs = absent};
        g_last_error[0] = '\0';
        ck_assert_int_eq(ops->sample(be, st, &p), BERTH_E_INVALID);
        ck_assert_str_eq(g_last_error, bad[i].msg);
    }
    sample_run_free(&s);
}
END_TEST

/* vLLM's rule (history_output_start): repetition counts the prompt and the output, presence and frequency the
 * output only. Logits and penalties are exact binary fractions, so every penalised logit below is exact and was
 * worked out by hand from berth/backend.h's step 1; the test checks the greedy token and the whole ranked list
 * (n_top = V) with its log-softmax. Logits of every row: */
static const float pen_logits[8] = {1.0f, 2.0f, 4.0f, -2.0f, 3.0f, 3.5f, 1.5f, 2.5f};
/* Every row's history: prompt 2 3 2 4 (id 2 twice), then output 4 7 7 (id 4 once more, id 7 twice). */
static const int32_t pen_hist_row[7] = {2, 3, 2, 4, 4, 7, 7};

/* Check row r of s: greedy token `id`, and the ranked list / logprobs of the penalised logits z. */
static void check_penalised_row(const struct sample_run *s, int32_t r, const float z[8], int32_t id, const char *what)
{
    struct scored o[8];
    double mx = -INFINITY, sum = 0.0;
    for (int32_t i = 0; i < 8; i++) {
        o[i] = (struct scored){z[i], i};
        mx = fmax(mx, z[i]);
    }
    for (int32_t i = 0; i < 8; i++)
        sum += exp(z[i] - mx);
    const double lse = mx + log(sum);
    qsort(o, 8, sizeof o[0], by_score_desc);
    CHECK((int32_t)tget(&s->ids.t, r, 0, 0, 0) == id, "%s row %d: id %d, expected %d", what, r,
          (int)tget(&s->ids.t, r, 0, 0, 0), id);
    check_close(tget(&s->lp.t, r, 0, 0, 0), z[id] - lse, 1.0, 1e-6, what, r, 0, 0, 0);
    for (int32_t j = 0; j < 8; j++) {
        CHECK((int32_t)tget(&s->tids.t, j, r, 0, 0) == o[j].id, "%s row %d rank %d: id %d, expected %d", what, r, j,
              (int)tget(&s->tids.t, j, r, 0, 0), o[j].id);
        check_close(tget(&s->tlp.t, j, r, 0, 0), o[j].v - lse, 1.0, 1e-6, what, j, r, 0, 0);
    }
}

START_TEST(test_sample_penalties_output_only)
{
    enum { R = 6, V = 8, H = 7 };
    struct sample_run s = sample_run_new(V, R, V);
    int32_t hist[R * H], hstart[R + 1], out_start[R];
    for (int32_t r = 0; r < R; r++) {
        for (int32_t i = 0; i < V; i++)
            tset(&s.logits.t, i, r, 0, 0, pen_logits[i]);
        memcpy(hist + r * H, pen_hist_row, sizeof pen_hist_row);
        hstart[r] = r * H;
        out_start[r] = r * H + 4; /* the output is 4 7 7 */
    }
    hstart[R] = R * H;
    out_start[4] = 5 * H; /* row 4: nothing generated yet (the output start is the row's end) */
    out_start[5] = 5 * H; /* row 5: the whole history is output (its start) */
    struct row_params rp[R];
    for (int32_t r = 0; r < R; r++)
        rp[r] = (struct row_params){.temperature = 0, .top_p = 1, .rep = 1, .seed = rng_next(), .counter = 0};
    rp[0].pres = 1.0f;
    rp[1].freq = 0.75f;
    rp[2].rep = 2.0f;
    rp[3].rep = 2.0f, rp[3].pres = 0.5f, rp[3].freq = 0.25f;
    rp[4].pres = 1.0f, rp[4].freq = 0.75f;
    rp[5].pres = 1.0f;
    /* Penalised logits by hand (ids 0 1 5 6 are never in the history and keep their logits). */
    static const float want[R][V] = {
        /* presence 1: the prompt-only ids 2 and 3 keep theirs; 4 and 7 (in the output) lose 1 */
        {1.0f, 2.0f, 4.0f, -2.0f, 2.0f, 3.5f, 1.5f, 1.5f},
        /* frequency 0.75 x output count: id 4 once (3 - 0.75), id 7 twice (2.5 - 1.5); 2 and 3 untouched */
        {1.0f, 2.0f, 4.0f, -2.0f, 2.25f, 3.5f, 1.5f, 1.0f},
        /* repetition 2 counts the prompt too: 4/2, -2*2, 3/2, 2.5/2 */
        {1.0f, 2.0f, 2.0f, -4.0f, 1.5f, 3.5f, 1.5f, 1.25f},
        /* all three: repetition on 2 3 4 7, then 4: 1.5 - 0.5 - 0.25, 7: 1.25 - 0.5 - 0.5 */
        {1.0f, 2.0f, 2.0f, -4.0f, 0.75f, 3.5f, 1.5f, 0.25f},
        /* no output yet: presence and frequency change nothing */
        {1.0f, 2.0f, 4.0f, -2.0f, 3.0f, 3.5f, 1.5f, 2.5f},
        /* the whole history as output: presence 1 on 2 3 4 7 */
        {1.0f, 2.0f, 3.0f, -3.0f, 2.0f, 3.5f, 1.5f, 1.5f}};
    static const int32_t want_id[R] = {2, 2, 5, 5, 2, 5};
    run_sample_out(&s, rp, R, V, hist, hstart, out_start);
    for (int32_t r = 0; r < R; r++)
        check_penalised_row(&s, r, want[r], want_id[r], "output-only penalties");

    /* history_output_start NULL: the whole history is output for all three penalties (the rule before ABI 0.3),
     * so presence/frequency now hit the prompt ids 2 and 3 and the greedy token moves to 5. */
    static const float old[R][V] = {
        {1.0f, 2.0f, 3.0f, -3.0f, 2.0f, 3.5f, 1.5f, 1.5f},    /* presence 1 on 2 3 4 7 */
        {1.0f, 2.0f, 2.5f, -2.75f, 1.5f, 3.5f, 1.5f, 1.0f},   /* frequency 0.75 x counts 2 1 2 2 */
        {1.0f, 2.0f, 2.0f, -4.0f, 1.5f, 3.5f, 1.5f, 1.25f},   /* repetition: as above */
        {1.0f, 2.0f, 1.0f, -4.75f, 0.5f, 3.5f, 1.5f, 0.25f},  /* 2: 2-.5-.5, 3: -4-.5-.25, 4: 1.5-.5-.5 */
        {1.0f, 2.0f, 1.5f, -3.75f, 0.5f, 3.5f, 1.5f, 0.0f},   /* 2: 4-1-1.5, 3: -2-1-.75, 4: 3-1-1.5, 7: 2.5-1-1.5 */
        {1.0f, 2.0f, 3.0f, -3.0f, 2.0f, 3.5f, 1.5f, 1.5f}};   /* as with its output start at the row's start */
    run_sample_out(&s, rp, R, V, hist, hstart, NULL);
    for (int32_t r = 0; r < R; r++)
        check_penalised_row(&s, r, old[r], 5, "whole-history penalties");

    /* A caller built before the field (struct_size stops short of it) gets the old rule: the pointer is not read,
     * even when it points at values the check would refuse. */
    const int32_t bad_start[R] = {-1, -1, -1, -1, -1, -1};
    float temp[R] = {0}, top_p[R] = {1, 1, 1, 1, 1, 1}, pres[R] = {1, 1, 1, 1, 1, 1};
    berth_sample_params p = {.struct_size = (uint32_t)BERTH_SIZE_TO(berth_sample_params, top_logprobs), .n_rows = 1,
                             .n_top = V, .temperature = temp, .top_p = top_p, .presence_penalty = pres,
                             .history = hist, .history_start = hstart, .logits = s.logits.t, .ids = s.ids.t,
                             .logprob = s.lp.t, .top_ids = s.tids.t, .top_logprobs = s.tlp.t,
                             .history_output_start = bad_start};
    p.logits.ne[1] = 1, p.ids.ne[0] = 1, p.logprob.ne[0] = 1, p.top_ids.ne[1] = 1, p.top_logprobs.ne[1] = 1;
    CHECK(ops->sample(be, st, &p) == BERTH_OK, "sample (short struct): %s", g_last_error);
    check_penalised_row(&s, 0, old[0], 5, "short struct");
    sample_run_free(&s);
}
END_TEST

/* history_output_start outside its row's [history_start[r], history_start[r+1]] (or without history_start) is
 * refused before any work, naming the row and the value (the shared check: the CUDA backend says the same). */
START_TEST(test_sample_refuses_bad_output_start)
{
    const int64_t V = 20;
    struct sample_run s = sample_run_new(V, 2, 0);
    trand(&s.logits.t, -3, 3);
    const int32_t hist[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, hstart[3] = {0, 4, 10};
    float pres[2] = {1, 1};
    static const struct {
        int32_t start0, start1;
        int null_hstart;
        const char *msg;
    } bad[] = {{4, 11, 0, "sample: row 1 history_output_start 11 is outside its history [4, 10]"},
               {4, 3, 0, "sample: row 1 history_output_start 3 is outside its history [4, 10]"},
               {-1, 4, 0, "sample: row 0 history_output_start -1 is outside its history [0, 4]"},
               {5, 10, 0, "sample: row 0 history_output_start 5 is outside its history [0, 4]"},
               {0, 4, 1, "sample: history_output_start is given without history_start"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int32_t out_start[2] = {bad[i].start0, bad[i].start1};
        berth_sample_params p = {.struct_size = sizeof p, .n_rows = 2, .presence_penalty = pres, .history = hist,
                                 .history_start = bad[i].null_hstart ? NULL : hstart, .logits = s.logits.t,
                                 .ids = s.ids.t, .logprob = absent, .top_ids = absent, .top_logprobs = absent,
                                 .history_output_start = out_start};
        g_last_error[0] = '\0';
        ck_assert_int_eq(ops->sample(be, st, &p), BERTH_E_INVALID);
        ck_assert_str_eq(g_last_error, bad[i].msg);
    }
    /* the range ends are valid: 0 and 4 (row 0 all output / none), 4 and 10 (row 1 all output / none) */
    const int32_t ends[2][2] = {{0, 10}, {4, 4}};
    for (int i = 0; i < 2; i++) {
        berth_sample_params p = {.struct_size = sizeof p, .n_rows = 2, .presence_penalty = pres, .history = hist,
                                 .history_start = hstart, .logits = s.logits.t, .ids = s.ids.t, .logprob = absent,
                                 .top_ids = absent, .top_logprobs = absent, .history_output_start = ends[i]};
        CHECK(ops->sample(be, st, &p) == BERTH_OK, "ends %d: %s", i, g_last_error);
    }
    sample_run_free(&s);
}
END_TEST

/* A row's token depends only on its logits, parameters, seed and counter: not on the rows around it. */
START_TEST(test_sample_batch_independent)
{
    const int64_t V = 2000;
    struct sample_run big = sample_run_new(V, 5, 0), one = sample_run_new(V, 1, 0);
    for (int trial = 0; trial < 20; trial++) {
        trand(&big.logits.t, -2, 2);
        struct row_params rp[5];
        for (int r = 0; r < 5; r++)
            rp[r] = (struct row_params){.temperature = (float)urand(0.5, 2), .top_p = (float)urand(0.5, 1.0),
                                        .min_p = 0, .rep = 1, .top_k = trial % 2 ? 50 : 0, .seed = rng_next(),
                                        .counter = rng_next()};
        run_sample(&big, rp, 5, 0, NULL, NULL);
        for (int r = 0; r < 5; r++) {
            for (int64_t i = 0; i < V; i++)
                tset(&one.logits.t, i, 0, 0, 0, tget(&big.logits.t, i, r, 0, 0));
            run_sample(&one, &rp[r], 1, 0, NULL, NULL);
            CHECK(tget(&one.ids.t, 0, 0, 0, 0) == tget(&big.ids.t, r, 0, 0, 0),
                  "trial %d row %d: %d alone, %d in a batch", trial, r, (int)tget(&one.ids.t, 0, 0, 0, 0),
                  (int)tget(&big.ids.t, r, 0, 0, 0));
        }
        /* same seed and counter again: same token */
        struct row_params again = rp[3];
        for (int64_t i = 0; i < V; i++)
            tset(&one.logits.t, i, 0, 0, 0, tget(&big.logits.t, i, 3, 0, 0));
        run_sample(&one, &again, 1, 0, NULL, NULL);
        ck_assert_int_eq((int)tget(&one.ids.t, 0, 0, 0, 0), (int)tget(&big.ids.t, 3, 0, 0, 0));
    }
    sample_run_free(&big);
    sample_run_free(&one);
}
END_TEST

/* Over many counters, each token is drawn with its probability. */
START_TEST(test_sample_distribution)
{
    const int32_t R = 4000;
    const double prob[4] = {0.1, 0.2, 0.3, 0.4};
    struct sample_run s = sample_run_new(4, R, 0);
    struct row_params *rp = malloc(sizeof *rp * (size_t)R);
    const uint64_t seed = rng_next();
    for (int32_t r = 0; r < R; r++) {
        for (int i = 0; i < 4; i++)
            tset(&s.logits.t, i, r, 0, 0, log(prob[i]) + 3.0);
        rp[r] = (struct row_params){.temperature = 1, .top_p = 1, .rep = 1, .seed = seed, .counter = (uint64_t)r};
    }
    /* run_sample's host arrays hold 64 rows: go in slices of 64 through views */
    int count[4] = {0};
    for (int32_t r0 = 0; r0 < R; r0 += 64) {
        struct sample_run v = s;
        v.logits.t.offset = s.logits.t.offset + (uint64_t)r0 * (uint64_t)s.logits.t.nb[1];
        v.logits.t.ne[1] = 64;
        v.ids.t.offset = (uint64_t)r0 * 4;
        v.ids.t.ne[0] = 64;
        v.lp.t.offset = (uint64_t)r0 * 4;
        v.lp.t.ne[0] = 64;
        const int32_t n = R - r0 < 64 ? R - r0 : 64;
        v.logits.t.ne[1] = n;
        v.ids.t.ne[0] = n;
        v.lp.t.ne[0] = n;
        run_sample(&v, rp + r0, n, 0, NULL, NULL);
        for (int32_t r = 0; r < n; r++)
            count[(int)tget(&v.ids.t, r, 0, 0, 0)]++;
    }
    for (int i = 0; i < 4; i++) /* 5 sigma of a binomial(4000, p) */
        CHECK(fabs(count[i] / (double)R - prob[i]) < 5 * sqrt(prob[i] * (1 - prob[i]) / R),
              "token %d drawn %d times of %d (p %.1f)", i, count[i], R, prob[i]);
    free(rp);
    sample_run_free(&s);
}
END_TEST

static void add_tests(TCase *tc)
{
    tcase_add_test(tc, test_log_softmax_topk);
    tcase_add_test(tc, test_philox_known_answers);
    tcase_add_test(tc, test_sample_reference);
    tcase_add_test(tc, test_sample_greedy_and_top1);
    tcase_add_test(tc, test_sample_refuses_unusable_rows);
    tcase_add_test(tc, test_sample_penalties_output_only);
    tcase_add_test(tc, test_sample_refuses_bad_output_start);
    tcase_add_test(tc, test_sample_batch_independent);
    tcase_add_test(tc, test_sample_distribution);
}

int main(void)
{
    return cpu_test_run("cpu_sample", add_tests);
}

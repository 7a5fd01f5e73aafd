/*
 * test_cpu_gdn.c — CPU backend plugin: the Gated DeltaNet recurrent ops conv1d_causal and gated_delta.
 * Harness and conventions: test_cpu_harness.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_cpu_harness.h"

/* ---------------------------------------------------------------------------------------------------------------
 * conv1d_causal, gated_delta */

START_TEST(test_conv1d_causal)
{
    const int64_t C = 13, K = 4, NS = 5;
    const int32_t qlen[3] = {5, 1, 3}, slotv[3] = {3, 0, 4};
    const int32_t T = 9, qsv[4] = {0, 5, 6, 9};
    for (int d = 0; d < 3; d++) {
        struct tt x = tt_new(BERTH_DTYPE_F32, C, T, 1, 1, 1), y = tt_new(BERTH_DTYPE_F32, C, T, 1, 1, 0);
        struct tt w = tt_new(wdts[d], K, C, 1, 1, 0), bias = tt_new(wdts[(d + 1) % 3], C, 1, 1, 1, 0);
        struct tt state = tt_new(BERTH_DTYPE_F32, K - 1, C, NS, 1, d);
        struct tt slots = ivec(slotv, 3), qs = ivec(qsv, 4);
        trand(&x.t, -1, 1);
        trand(&w.t, -0.5, 0.5);
        trand(&bias.t, -0.5, 0.5);
        trand(&state.t, -1, 1);
        double *s0 = tload(&state.t), *xv = tload(&x.t);
        const int alias = d == 2; /* y may overwrite x in place */
        const berth_tensor out = alias ? x.t : y.t;
        tpoison(&y.t);
        berth_conv1d_causal_params p = {.struct_size = sizeof p, .act = BERTH_ACT_SILU, .n_seqs = 3, .x = x.t,
                                        .w = w.t, .bias = d ? bias.t : absent, .y = out, .state = state.t,
                                        .state_slots = slots.t, .seq_q_start = qs.t};
        ck_assert_int_eq(vt->supports(be, BERTH_OP_CONV1D_CAUSAL, &p), BERTH_OK);
        CHECK(ops->conv1d_causal(be, st, &p) == BERTH_OK, "%s", g_last_error);
        for (int i = 0; i < 3; i++)
            for (int64_t c = 0; c < C; c++) {
                double xx[3 + 5];
                for (int j = 0; j < K - 1; j++)
                    xx[j] = s0[(slotv[i] * C + c) * (K - 1) + j];
                for (int t = 0; t < qlen[i]; t++)
                    xx[K - 1 + t] = xv[(qsv[i] + t) * C + c];
                for (int t = 0; t < qlen[i]; t++) {
                    double acc = d ? tget(&bias.t, c, 0, 0, 0) : 0;
                    for (int j = 0; j < K; j++)
                        acc += tget(&w.t, j, c, 0, 0) * xx[t + j];
                    const double ref = act_ref(BERTH_ACT_SILU, acc);
                    check_close(tget(&out, c, qsv[i] + t, 0, 0), ref, fabs(ref) + 1, 1e-6, "conv1d", c, qsv[i] + t, i, d);
                }
                for (int j = 0; j < K - 1; j++) /* the state keeps the last K-1 inputs */
                    CHECK(tget(&state.t, j, c, slotv[i], 0) == xx[qlen[i] + j], "conv1d state seq %d ch %" PRId64 " [%d]",
                          i, c, j);
            }
        for (int64_t c = 0; c < C; c++) /* unused slots untouched */
            for (int j = 0; j < K - 1; j++)
                for (int sl = 1; sl < 3; sl++)
                    CHECK(tget(&state.t, j, c, sl, 0) == s0[(sl * C + c) * (K - 1) + j], "conv1d touched slot %d", sl);
        free(s0);
        free(xv);
        tt_free(&x);
        tt_free(&y);
        tt_free(&w);
        tt_free(&bias);
        tt_free(&state);
        tt_free(&slots);
        tt_free(&qs);
    }
}
END_TEST

/* Reference gated delta rule for one sequence and value head (S: dk x dv, row-major, updated). */
static void ref_delta(double *S, int64_t dk, int64_t dv, const double *q0, const double *k0, const double *v, double g,
                      double beta, int l2, double scale, double *out)
{
    double q[64], k[64], u[64], qn = 0, kn = 0;
    for (int64_t i = 0; i < dk; i++) {
        qn += q0[i] * q0[i];
        kn += k0[i] * k0[i];
    }
    for (int64_t i = 0; i < dk; i++) {
        q[i] = q0[i] * (l2 ? 1 / sqrt(qn + 1e-6) : 1) * scale;
        k[i] = k0[i] * (l2 ? 1 / sqrt(kn + 1e-6) : 1);
    }
    for (int64_t j = 0; j < dv; j++) {
        u[j] = 0;
        for (int64_t i = 0; i < dk; i++) {
            S[i * dv + j] *= exp(g);
            u[j] += S[i * dv + j] * k[i];
        }
    }
    for (int64_t j = 0; j < dv; j++) {
        out[j] = 0;
        for (int64_t i = 0; i < dk; i++) {
            S[i * dv + j] += k[i] * beta * (v[j] - u[j]);
            out[j] += S[i * dv + j] * q[i];
        }
    }
}

START_TEST(test_gated_delta)
{
    const int64_t dk = 16, dv = 12, Hk = 2, Hv = 4, NS = 4;
    const int32_t qlen[3] = {4, 1, 2}, slotv[3] = {2, 0, 3}, qsv[4] = {0, 4, 5, 7}, T = 7;
    for (int l2 = 0; l2 < 2; l2++) {
        struct tt q = tt_new(BERTH_DTYPE_F32, dk, Hk, T, 1, 1), k = tt_new(BERTH_DTYPE_F32, dk, Hk, T, 1, 0);
        struct tt v = tt_new(BERTH_DTYPE_F32, dv, Hv, T, 1, 2), out = tt_new(BERTH_DTYPE_F32, dv, Hv, T, 1, 1);
        struct tt g = tt_new(BERTH_DTYPE_F32, Hv, T, 1, 1, 0), beta = tt_new(BERTH_DTYPE_F32, Hv, T, 1, 1, 1);
        struct tt state = tt_new(BERTH_DTYPE_F32, dv, dk, Hv, NS, l2);
        struct tt slots = ivec(slotv, 3), qs = ivec(qsv, 4);
        trand(&q.t, -1, 1);
        trand(&k.t, -1, 1);
        trand(&v.t, -1, 1);
        trand(&g.t, -1.5, 0);
        trand(&beta.t, 0.05, 0.95);
        trand(&state.t, -0.3, 0.3);
        double *S = tload(&state.t); /* [slot][head][dk][dv] */
        tpoison(&out.t);
        const float scale = 1.0f / sqrtf((float)dk);
        berth_gated_delta_params p = {.struct_size = sizeof p, .qk_l2norm = l2, .scale = scale, .chunk_size = l2 ? 64 : 0,
                                      .n_seqs = 3, .q = q.t, .k = k.t, .v = v.t, .g = g.t, .beta = beta.t, .out = out.t,
                                      .state = state.t, .state_slots = slots.t, .seq_q_start = qs.t};
        ck_assert_int_eq(vt->supports(be, BERTH_OP_GATED_DELTA, &p), BERTH_OK);
        CHECK(ops->gated_delta(be, st, &p) == BERTH_OK, "%s", g_last_error);
        for (int i = 0; i < 3; i++)
            for (int64_t h = 0; h < Hv; h++) {
                double *Sh = S + (slotv[i] * Hv + h) * dk * dv;
                const int64_t kh = h / (Hv / Hk);
                for (int t = qsv[i]; t < qsv[i] + qlen[i]; t++) {
                    double qq[16], kk[16], vv[12], o[12];
                    for (int64_t e = 0; e < dk; e++) {
                        qq[e] = tget(&q.t, e, kh, t, 0);
                        kk[e] = tget(&k.t, e, kh, t, 0);
                    }
                    for (int64_t e = 0; e < dv; e++)
                        vv[e] = tget(&v.t, e, h, t, 0);
                    ref_delta(Sh, dk, dv, qq, kk, vv, tget(&g.t, h, t, 0, 0), tget(&beta.t, h, t, 0, 0), l2, scale, o);
                    for (int64_t e = 0; e < dv; e++)
                        check_close(tget(&out.t, e, h, t, 0), o[e], fabs(o[e]) + 1, 1e-5, "gated_delta out", e, h, t, l2);
                }
            }
        size_t n = 0;
        FOR_EACH(&state.t, a, b, c, d2) /* every slot: updated ones match the reference, others unchanged */
        {
            check_close(tget(&state.t, a, b, c, d2), S[n], fabs(S[n]) + 1, 1e-5, "gated_delta state", a, b, c, d2);
            n++;
        }
        free(S);
        tt_free(&q);
        tt_free(&k);
        tt_free(&v);
        tt_free(&out);
        tt_free(&g);
        tt_free(&beta);
        tt_free(&state);
        tt_free(&slots);
        tt_free(&qs);
    }
}
END_TEST

static void add_tests(TCase *tc)
{
    tcase_add_test(tc, test_conv1d_causal);
    tcase_add_test(tc, test_gated_delta);
}

int main(void)
{
    return cpu_test_run("cpu_gdn", add_tests);
}

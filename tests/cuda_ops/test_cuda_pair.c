/*
 * test_cuda_pair.c — a pair of products (berth_matmul_params.y_then, ABI 0.6) with the norms either side, on the
 * CUDA backend against the CPU backend's four ops in turn (tests/cuda_ops/harness.h).
 *
 * By default the backend runs a pair as the two products in turn. With BERTH_CUDA_PAIR=1, where the pair fits
 * plugins/backend-cuda/matmul_pair.cu's kernel (bf16 weights, up to 64 rows, widths that split over its cluster,
 * rows it keeps in registers, the memory rules of its file comment), it runs as that one kernel. With =2 (strict)
 * a pair the kernel declines fails: each case says whether it must fuse, and in the strict run a case that must
 * not fuse must fail with the kernel's message, so both the kernel and its plan's refusals are tested.
 *
 * Each case runs on both backends (outputs NaN-poisoned first) and is compared; then the CUDA side runs again
 * with its outputs poisoned and its inputs restored: the same bytes (no race between the cluster's blocks).
 */
#include "harness.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 BERTH_DTYPE_F32
#define BF16 BERTH_DTYPE_BF16
#define WGT BERTH_USAGE_WEIGHTS

enum { AL_NONE, AL_GEMMA, AL_PRE_INPLACE };

struct pc_case {
    int64_t M, D, P;  /* rows; the first product D -> P, the second P -> D */
    berth_dtype wdt;  /* both products' weights */
    int pre;          /* x_pre: 0 none, 1 ADD_AFTER (x = its y), 2 ADD_AFTER with a second output (x = its y2) */
    int glu;          /* BERTH_GLU_NONE or MUL (the factor in strided rows) */
    int post;         /* y_norm: 0 none, 1 ADD_AFTER * out_scale, 2 the same with a second output */
    int wmode;        /* the norms' weight mode (y2: W) */
    berth_dtype nwdt; /* the norms' weights */
    int alias;        /* AL_GEMMA: the second product's y is x_pre's x, y_norm's y is x_pre's residual and y_norm's
                       * residual is x_pre's y (Gemma 4's buffers); AL_PRE_INPLACE: x_pre's y over its x */
    int fused;        /* the kernel must take it */
};

static const struct pc_case cases[] = {
    /* Gemma 4 E2B's per-layer-input block: 1 (batch 1), 3, 8, 12, 32 and 64 rows */
    {1, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 1},
    {3, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 1},
    {8, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 1},
    {12, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 1},
    {32, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 1},
    {64, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 1},
    /* the last layer's: no second output */
    {1, 1536, 256, BF16, 1, BERTH_GLU_MUL, 1, BERTH_NORM_W, BF16, AL_GEMMA, 1},
    /* E4B's widths (2560 -> 256): rows longer than the kernel keeps in registers (two products) */
    {2, 2560, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 0},
    /* no norms, no epilogue; the other weight modes and dtypes; x_pre with a second output; separate buffers */
    {1, 512, 128, BF16, 0, BERTH_GLU_NONE, 0, BERTH_NORM_W, BF16, AL_NONE, 1},
    {5, 1024, 64, BF16, 2, BERTH_GLU_MUL, 1, BERTH_NORM_W_ONE_PLUS, F32, AL_NONE, 1},
    {7, 768, 96, BF16, 1, BERTH_GLU_NONE, 2, BERTH_NORM_UNIT, BERTH_DTYPE_F16, AL_NONE, 1},
    {1, 1536, 256, BF16, 2, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_NONE, 1},
    /* not for the kernel: 65 rows, f32 weights, a middle width that does not split over 16 blocks, x_pre's y over
     * its own x (other blocks still read it) */
    {65, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 0},
    {1, 1536, 256, F32, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_GEMMA, 0},
    {2, 512, 40, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_NONE, 0},
    {1, 1536, 256, BF16, 1, BERTH_GLU_MUL, 2, BERTH_NORM_W, BF16, AL_PRE_INPLACE, 0},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static int pair_mode(void)
{
    const char *v = getenv("BERTH_CUDA_PAIR");
    return v && *v ? atoi(v) : 0;
}

static double max_abs(const struct hx_tensor *t)
{
    const int64_t n = (int64_t)(t->bytes / sizeof(float));
    float *v = malloc(t->bytes);
    ck_assert_ptr_nonnull(v);
    hx_get(t, HX_CPU, v);
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)v[i]));
    free(v);
    return m;
}

/* t = t * 1 on the GPU side, enqueued without waiting: a kernel that writes t just before the next op. */
static void gpu_rewrite(const struct hx_tensor *t, const char *what)
{
    berth_unary_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.act = BERTH_ACT_IDENTITY;
    p.in_scale = 1.0f;
    p.out_scale = 1.0f;
    p.x = t->t[HX_GPU];
    p.y = t->t[HX_GPU];
    ck_assert_msg(hx_op(HX_GPU, BERTH_OP_UNARY, &p) == BERTH_OK, "%s: unary: %s", what, hx_last_error);
}

START_TEST(test_matmul_pair)
{
    const struct pc_case *c = &cases[_i];
    const int64_t M = c->M, D = c->D, P = c->P, LDU = P + 8; /* the GLU factor: rows P + 8 floats apart */
    char what[200];
    snprintf(what, sizeof what, "pair M=%lld D=%lld P=%lld w=%s pre=%d glu=%d post=%d wmode=%d nw=%s alias=%d",
             (long long)M, (long long)D, (long long)P, hx_dtype_name(c->wdt), c->pre, c->glu, c->post, c->wmode,
             hx_dtype_name(c->nwdt), c->alias);
    struct hx_tensor A = hx_new(F32, D, M, 0, 0), RES = hx_new(F32, D, M, 0, 0), H = hx_new(F32, D, M, 0, 0),
                     H2 = hx_new(F32, D, M, 0, 0), G = hx_new(F32, P, M, 0, 0), UP = hx_new(F32, LDU, M, 0, 0),
                     A2 = hx_new(F32, D, M, 0, 0), O = hx_new(F32, D, M, 0, 0), U = hx_new(F32, D, M, 0, 0),
                     RES2 = hx_new(F32, D, M, 0, 0);
    /* weights in weights buffers, as a model's: the kernel reads them before its PDL wait */
    struct hx_tensor W1 = hx_new_usage(c->wdt, WGT, D, P, 0, 0), W2 = hx_new_usage(c->wdt, WGT, P, D, 0, 0),
                     FW = hx_new_usage(c->nwdt, WGT, D, 0, 0, 0), FW2 = hx_new_usage(c->nwdt, WGT, D, 0, 0, 0),
                     PW = hx_new_usage(c->nwdt, WGT, D, 0, 0, 0), PW2 = hx_new_usage(c->nwdt, WGT, D, 0, 0, 0);
    hx_rand(&A, -2.0f, 2.0f);
    hx_rand(&RES, -1.0f, 1.0f);
    hx_rand(&RES2, -1.0f, 1.0f);
    hx_rand(&UP, -1.0f, 1.0f);
    hx_rand(&W1, -0.5f, 0.5f);
    hx_rand(&W2, -0.5f, 0.5f);
    hx_rand(&FW, -1.0f, 1.0f);
    hx_rand(&FW2, -1.0f, 1.0f);
    hx_rand(&PW, -1.0f, 1.0f);
    hx_rand(&PW2, -1.0f, 1.0f);
    /* without x_pre the first product reads H itself */
    if (c->pre == 0)
        hx_rand(&H, -1.0f, 1.0f);
    const bool gemma = c->alias == AL_GEMMA, inplace = c->alias == AL_PRE_INPLACE;
    const bool wgt = c->wmode == BERTH_NORM_W || c->wmode == BERTH_NORM_W_ONE_PLUS;
    berth_rms_norm_params pre[2], post[2];
    berth_matmul_params p1[2], p2[2];
    for (int s = 0; s < 2; s++) {
        memset(&pre[s], 0, sizeof pre[s]);
        pre[s].struct_size = sizeof pre[s];
        pre[s].weight_mode = c->wmode;
        pre[s].resid_mode = BERTH_RESID_ADD_AFTER;
        pre[s].eps = 1e-6f;
        pre[s].x = A.t[s];
        if (wgt)
            pre[s].w = FW.t[s];
        pre[s].residual = RES.t[s];
        pre[s].y = inplace ? A.t[s] : H.t[s];
        if (c->pre == 2) {
            pre[s].y2_weight_mode = BERTH_NORM_W;
            pre[s].y2_w = FW2.t[s];
            pre[s].y2 = H2.t[s];
        }
        memset(&p2[s], 0, sizeof p2[s]);
        p2[s].struct_size = sizeof p2[s];
        p2[s].x = G.t[s];
        p2[s].w = W2.t[s];
        p2[s].y = gemma ? A.t[s] : A2.t[s];
        memset(&post[s], 0, sizeof post[s]);
        post[s].struct_size = sizeof post[s];
        post[s].weight_mode = c->wmode;
        post[s].resid_mode = BERTH_RESID_ADD_AFTER;
        post[s].eps = 1e-6f;
        post[s].x = p2[s].y;
        if (wgt)
            post[s].w = PW.t[s];
        post[s].residual = gemma ? H.t[s] : RES2.t[s];
        post[s].y = gemma ? RES.t[s] : O.t[s];
        post[s].out_scale = 0.75f;
        if (c->post == 2) {
            post[s].y2_weight_mode = BERTH_NORM_W;
            post[s].y2_w = PW2.t[s];
            post[s].y2 = U.t[s];
        }
        if (c->post)
            p2[s].y_norm = &post[s];
        memset(&p1[s], 0, sizeof p1[s]);
        p1[s].struct_size = sizeof p1[s];
        p1[s].x = c->pre == 0 ? H.t[s] : c->pre == 2 ? H2.t[s] : pre[s].y;
        p1[s].w = W1.t[s];
        p1[s].y = G.t[s];
        p1[s].y_glu = c->glu;
        p1[s].y_glu_act = BERTH_ACT_GELU_TANH;
        if (c->glu == BERTH_GLU_MUL)
            p1[s].y_glu_up = hx_view(&UP, s, 0, P, M, 1, 1, LDU, LDU * M, LDU * M);
        if (c->pre)
            p1[s].x_pre = &pre[s];
        p1[s].y_then = &p2[s];
    }
    ck_assert_msg(hx_supports(HX_CPU, BERTH_OP_MATMUL, &p1[HX_CPU]) == BERTH_OK, "%s: %s", what, hx_last_error);

    if (pair_mode() == 2 && !c->fused) { /* strict: the plan must decline it, and nothing runs */
        const berth_status st = hx_op(HX_GPU, BERTH_OP_MATMUL, &p1[HX_GPU]);
        ck_assert_msg(st == BERTH_E_UNSUPPORTED, "%s: the pair kernel took a pair it must decline", what);
        ck_assert_str_eq(hx_last_error,
                         "cuda: matmul: y_then: the pair kernel does not take this pair (BERTH_CUDA_PAIR=2)");
    } else {
        /* what the op writes; the inputs it overwrites (Gemma's aliasing, the in-place norm) are restored for the
         * second run */
        const struct hx_tensor *outs[6] = {c->pre ? (inplace ? &A : &H) : NULL, c->pre == 2 ? &H2 : NULL, &G,
                                           gemma ? &A : &A2, c->post ? (gemma ? &RES : &O) : NULL,
                                           c->post == 2 ? &U : NULL};
        const struct hx_tensor *inputs[3] = {&A, &RES, c->pre == 0 ? &H : NULL};
        void *init[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++)
            if (inputs[i]) {
                init[i] = malloc(inputs[i]->bytes);
                ck_assert_ptr_nonnull(init[i]);
                hx_get(inputs[i], HX_CPU, init[i]);
            }
        /* on the GPU, kernels that rewrite the pair's inputs (x * 1) are enqueued right before it, with no sync:
         * the pair must wait for them (its weights it may read earlier) */
        ck_assert_msg(hx_op(HX_CPU, BERTH_OP_MATMUL, &p1[HX_CPU]) == BERTH_OK, "%s: cpu: %s", what, hx_last_error);
        gpu_rewrite(&A, what);
        gpu_rewrite(&RES, what);
        ck_assert_msg(hx_op(HX_GPU, BERTH_OP_MATMUL, &p1[HX_GPU]) == BERTH_OK, "%s: cuda: %s", what, hx_last_error);
        hx_sync();
        /* fp32 sums in other orders: a few ulps of each output's scale per sqrt(depth) */
        const double depth[6] = {1.0, 1.0, (double)D, (double)P, 1.0, 1.0};
        for (int i = 0; i < 6; i++) {
            if (!outs[i])
                continue;
            char w2[260];
            snprintf(w2, sizeof w2, "%s: output %d", what, i);
            const double scale = fmax(1.0, max_abs(outs[i]));
            /* the norms after the products inherit the products' error relative to their rms */
            const double atol = (i >= 4 ? 2e-5 * sqrt((double)P) : i < 2 ? 1e-5 : 4e-6 * sqrt(depth[i])) * scale;
            hx_expect_close(outs[i], atol, 1e-5, w2);
        }
        /* again on the GPU, outputs poisoned, inputs restored: the same bytes */
        const struct hx_side *g = &hx->side[HX_GPU];
        void *snap[6] = {NULL};
        for (int i = 0; i < 6; i++)
            if (outs[i]) {
                snap[i] = malloc(outs[i]->bytes);
                ck_assert_ptr_nonnull(snap[i]);
                hx_get(outs[i], HX_GPU, snap[i]);
                ck_assert(g->vt->buffer_fill(g->be, g->s, outs[i]->buf[HX_GPU], 0, 0xFF, outs[i]->bytes) ==
                          BERTH_OK);
            }
        for (int i = 0; i < 3; i++)
            if (inputs[i])
                ck_assert(g->vt->buffer_upload(g->be, g->s, inputs[i]->buf[HX_GPU], 0, init[i], inputs[i]->bytes) ==
                          BERTH_OK);
        gpu_rewrite(&A, what);
        ck_assert_msg(hx_op(HX_GPU, BERTH_OP_MATMUL, &p1[HX_GPU]) == BERTH_OK, "%s: second run: %s", what,
                      hx_last_error);
        hx_sync();
        for (int i = 0; i < 6; i++) {
            if (!outs[i])
                continue;
            void *got = malloc(outs[i]->bytes);
            ck_assert_ptr_nonnull(got);
            hx_get(outs[i], HX_GPU, got);
            ck_assert_msg(memcmp(got, snap[i], outs[i]->bytes) == 0, "%s: second run: output %d differs", what, i);
            free(got);
            free(snap[i]);
        }
        for (int i = 0; i < 3; i++)
            free(init[i]);
    }
    hx_free(&A);
    hx_free(&RES);
    hx_free(&H);
    hx_free(&H2);
    hx_free(&G);
    hx_free(&UP);
    hx_free(&A2);
    hx_free(&O);
    hx_free(&U);
    hx_free(&RES2);
    hx_free(&W1);
    hx_free(&W2);
    hx_free(&FW);
    hx_free(&FW2);
    hx_free(&PW);
    hx_free(&PW2);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("cuda_pair");
    TCase *tc = tcase_create("pair");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_matmul_pair, 0, N_CASES);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return hx_main(argc, argv, make_suite);
}

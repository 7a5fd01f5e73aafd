/*
 * test_cuda_sample.c — the CUDA backend's sample and log_softmax_topk against the CPU backend (harness.h).
 *
 * Logits are built so that every decision is exact on both backends: each row holds distinct values on a
 * power-of-two grid (exact in fp32, still distinct after the divisions and shifts the ops apply), and ties are
 * planted as exact duplicates. What remains backend-dependent is the rounding of exp and of the double sums, which
 * moves probabilities by a few parts in 10^7; a double-precision reference of the specified algorithm flags the
 * rare rows whose top-p, min-p or draw decision falls within that distance of a boundary ("ambiguous"). Every other
 * row must give the reference's token on both backends; logprobs (on rows with the same token) and top lists are
 * compared on every row.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Rows of logits. */

/* Largest power of two step with step * V <= 16 (so values span about +-8), times scale (a power of two). */
static double grid_step(int64_t V, double scale)
{
    double step = 1.0;
    while (step * (double)V > 16.0)
        step /= 2.0;
    return step * scale;
}

/* V distinct values (a random permutation of the grid), exactly representable. */
static void grid_row(float *x, int64_t V, double scale)
{
    int32_t *perm = malloc(sizeof *perm * (size_t)V);
    ck_assert_ptr_nonnull(perm);
    for (int64_t i = 0; i < V; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = V - 1; i > 0; i--) {
        const int64_t j = (int64_t)(hx_rand_u64() % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const double step = grid_step(V, scale);
    for (int64_t i = 0; i < V; i++)
        x[i] = (float)((double)(perm[i] - V / 2) * step);
    free(perm);
}

struct ranked {
    float v;
    int32_t id;
};
static int by_value_desc(const void *a, const void *b)
{
    const struct ranked *x = a, *y = b;
    if (x->v != y->v)
        return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Id of the rank-th largest value (0 = largest; ties: lower id first). */
static int32_t rank_id(const float *x, int64_t V, int64_t rank)
{
    struct ranked *o = malloc(sizeof *o * (size_t)V);
    ck_assert_ptr_nonnull(o);
    for (int64_t i = 0; i < V; i++)
        o[i] = (struct ranked){x[i], (int32_t)i};
    qsort(o, (size_t)V, sizeof *o, by_value_desc);
    const int32_t id = o[rank].id;
    free(o);
    return id;
}

/* ---------------------------------------------------------------------------------------------------------------
 * The reference: berth/backend.h's algorithm with the decisions in fp32 exactly as specified (penalties, w = z / t,
 * the exponent w - max) and the probabilities in double. */

struct rowp {
    float temp, top_p, min_p, rep, pres, freq;
    int32_t top_k;
    uint64_t seed, counter;
};

static struct rowp rowp_plain(void)
{
    return (struct rowp){.temp = 0.0f, .top_p = 1.0f, .min_p = 0.0f, .rep = 1.0f, .pres = 0.0f, .freq = 0.0f,
                         .top_k = 0, .seed = hx_rand_u64(), .counter = hx_rand_u64()};
}

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

/* Relative distances below which a backend's fp32 probabilities (exp within 2 ulp, then two roundings) may
 * decide differently from the exact ones. */
#define AMB_TOP_P 3e-7
#define AMB_MIN_P 5e-7
#define AMB_DRAW 5e-7

/* Penalised logits of one row into z (fp32, the specified order of operations). hist[n_in..nh) is the row's
 * output (history_output_start; n_in 0 without it): repetition counts all nh ids, presence/frequency the output. */
static void ref_penalise(const float *x, int64_t V, const struct rowp *rp, const int32_t *hist, int32_t nh,
                         int32_t n_in, float *z)
{
    memcpy(z, x, sizeof *z * (size_t)V);
    if (nh <= 0 || (rp->rep == 1.0f && rp->pres == 0.0f && rp->freq == 0.0f))
        return;
    int32_t *cnt = calloc((size_t)V, sizeof *cnt), *out = calloc((size_t)V, sizeof *out);
    ck_assert(cnt && out);
    for (int32_t i = 0; i < nh; i++) {
        cnt[hist[i]]++;
        out[hist[i]] += i >= n_in;
    }
    for (int64_t i = 0; i < V; i++) {
        if (!cnt[i])
            continue;
        float v = z[i];
        if (rp->rep != 1.0f)
            v = v > 0.0f ? v / rp->rep : v * rp->rep;
        if (out[i] > 0) {
            v -= rp->pres;
            v -= rp->freq * (float)out[i];
        }
        z[i] = v;
    }
    free(cnt);
    free(out);
}

/* The token of one row; *amb set when a probability decision is too close to call. z: penalised logits. */
static int32_t ref_pick(const float *z, int64_t V, const struct rowp *rp, int *amb)
{
    *amb = 0;
    if (!(rp->temp > 0.0f)) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (z[i] > z[best])
                best = i;
        return best;
    }
    struct ranked *o = malloc(sizeof *o * (size_t)V);
    double *p = malloc(sizeof *p * (size_t)V), *pid = calloc((size_t)V, sizeof *pid);
    ck_assert(o && p && pid);
    for (int64_t i = 0; i < V; i++)
        o[i] = (struct ranked){z[i] / rp->temp, (int32_t)i};
    qsort(o, (size_t)V, sizeof *o, by_value_desc);
    int64_t n = rp->top_k > 0 && rp->top_k < V ? rp->top_k : V;
    const float mx = o[0].v;
    double S = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const float d = o[i].v - mx;
        p[i] = exp((double)d);
        S += p[i];
    }
    for (int64_t i = 0; i < n; i++)
        p[i] /= S;
    if (rp->top_p < 1.0f) {
        double cum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            cum += p[i];
            if (fabs(cum - (double)rp->top_p) < AMB_TOP_P)
                *amb = 1;
            if (cum >= (double)rp->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    const double floor_p = rp->min_p > 0.0f ? (double)rp->min_p * p[0] : -1.0;
    for (int64_t i = 0; i < n; i++) {
        /* ids tied with the best always survive (min_p <= 1): only the others can be close calls */
        if (rp->min_p > 0.0f && p[i] != p[0] && fabs(p[i] - floor_p) < AMB_MIN_P * p[0])
            *amb = 1;
        if (p[i] >= floor_p)
            pid[o[i].id] = p[i];
    }
    double total = 0.0;
    for (int64_t i = 0; i < V; i++)
        total += pid[i];
    const double target = ref_uniform(rp->seed, rp->counter) * total;
    double cum = 0.0;
    int32_t pick = -1;
    for (int32_t i = 0; i < V && pick < 0; i++) {
        if (pid[i] == 0.0)
            continue;
        cum += pid[i];
        if (fabs(cum - target) < AMB_DRAW * total)
            *amb = 1;
        if (cum > target)
            pick = i;
    }
    free(o);
    free(p);
    free(pid);
    return pick;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Running one sample call on both backends. */

struct scase {
    const char *name;
    int64_t V;
    int32_t R;
    int32_t n_top;
    int want_lp;
    int64_t pad;          /* logits rows are a view: V of V + pad floats per row (the pad must never be read) */
    float *x;             /* R rows of V */
    struct rowp *rp;      /* R rows */
    int32_t *hist;        /* NULL: no history arrays */
    int32_t *hstart;      /* R + 1 */
    int32_t *out_start;   /* R absolute output starts (history_output_start); NULL: not given */
    int null_arrays;      /* pass NULL for every per-row array (all greedy, no filters) */
};

struct sout {
    int32_t *ids[2];
    float *lp[2];
    int32_t *tids[2];
    float *tlp[2];
};

static struct scase scase_new(const char *name, int64_t V, int32_t R, int32_t n_top, int want_lp, double scale)
{
    struct scase c = {.name = name, .V = V, .R = R, .n_top = n_top, .want_lp = want_lp};
    c.x = malloc(sizeof *c.x * (size_t)(V * R));
    c.rp = malloc(sizeof *c.rp * (size_t)R);
    ck_assert(c.x && c.rp);
    for (int32_t r = 0; r < R; r++) {
        grid_row(c.x + (int64_t)r * V, V, scale);
        c.rp[r] = rowp_plain();
    }
    return c;
}

static void scase_free(struct scase *c)
{
    free(c->x);
    free(c->rp);
    free(c->hist);
    free(c->hstart);
    free(c->out_start);
}

static void sout_free(struct sout *o)
{
    for (int s = 0; s < 2; s++) {
        free(o->ids[s]);
        free(o->lp[s]);
        free(o->tids[s]);
        free(o->tlp[s]);
    }
}

static berth_tensor no_buf(berth_tensor t)
{
    t.buf = NULL;
    return t;
}

/* Run c on both sides (supports() first, then the op); returns the two statuses, outputs read back when both OK.
 * msg[side] gets each side's error message. */
static void run_sample(const struct scase *c, struct sout *o, berth_status st[2], char msg[2][512])
{
    const int64_t V = c->V, W = V + c->pad;
    const int32_t R = c->R, nt = c->n_top;
    struct hx_tensor L = hx_new(BERTH_DTYPE_F32, W, R, 0, 0);
    float *host = malloc(sizeof *host * (size_t)(W * R));
    ck_assert_ptr_nonnull(host);
    for (int32_t r = 0; r < R; r++) {
        memcpy(host + (int64_t)r * W, c->x + (int64_t)r * V, sizeof *host * (size_t)V);
        for (int64_t i = V; i < W; i++)
            host[(int64_t)r * W + i] = 1e4f; /* larger than any logit: reading it would win every argmax */
    }
    hx_set(&L, host);
    free(host);
    struct hx_tensor ids = hx_new(BERTH_DTYPE_I32, R, 0, 0, 0), lp = hx_new(BERTH_DTYPE_F32, R, 0, 0, 0);
    struct hx_tensor tids = hx_new(BERTH_DTYPE_I32, nt > 0 ? nt : 1, R, 0, 0);
    struct hx_tensor tlp = hx_new(BERTH_DTYPE_F32, nt > 0 ? nt : 1, R, 0, 0);
    float *fa = malloc(sizeof *fa * (size_t)R * 6);
    int32_t *top_k = malloc(sizeof *top_k * (size_t)R);
    uint64_t *seed = malloc(sizeof *seed * (size_t)R), *counter = malloc(sizeof *counter * (size_t)R);
    ck_assert(fa && top_k && seed && counter);
    for (int32_t r = 0; r < R; r++) {
        fa[r] = c->rp[r].temp;
        fa[R + r] = c->rp[r].top_p;
        fa[2 * R + r] = c->rp[r].min_p;
        fa[3 * R + r] = c->rp[r].rep;
        fa[4 * R + r] = c->rp[r].pres;
        fa[5 * R + r] = c->rp[r].freq;
        top_k[r] = c->rp[r].top_k;
        seed[r] = c->rp[r].seed;
        counter[r] = c->rp[r].counter;
    }
    for (int side = 0; side < 2; side++) {
        berth_sample_params p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.n_rows = R;
        p.n_top = nt;
        if (!c->null_arrays) {
            p.temperature = fa;
            p.top_p = fa + R;
            p.min_p = fa + 2 * R;
            p.repetition_penalty = fa + 3 * R;
            p.presence_penalty = fa + 4 * R;
            p.frequency_penalty = fa + 5 * R;
            p.top_k = top_k;
            p.seed = seed;
            p.counter = counter;
            p.history = c->hist;
            p.history_start = c->hstart;
            p.history_output_start = c->out_start;
        }
        p.logits = L.t[side];
        p.logits.ne[0] = V;
        p.ids = ids.t[side];
        if (c->want_lp)
            p.logprob = lp.t[side];
        if (nt > 0) {
            p.top_ids = tids.t[side];
            p.top_logprobs = tlp.t[side];
        }
        berth_sample_params q = p;
        q.logits = no_buf(q.logits);
        q.ids = no_buf(q.ids);
        q.logprob = no_buf(q.logprob);
        q.top_ids = no_buf(q.top_ids);
        q.top_logprobs = no_buf(q.top_logprobs);
        const berth_status sup = hx_supports(side, BERTH_OP_SAMPLE, &q);
        ck_assert_msg(sup == BERTH_OK, "%s: supports() on side %d: %d: %s", c->name, side, sup, hx_last_error);
        st[side] = hx_op(side, BERTH_OP_SAMPLE, &p);
        snprintf(msg[side], 512, "%s", st[side] == BERTH_OK ? "" : hx_last_error);
    }
    hx_sync();
    memset(o, 0, sizeof *o);
    if (st[0] == BERTH_OK && st[1] == BERTH_OK)
        for (int side = 0; side < 2; side++) {
            o->ids[side] = malloc(ids.bytes);
            o->lp[side] = malloc(lp.bytes);
            o->tids[side] = malloc(tids.bytes);
            o->tlp[side] = malloc(tlp.bytes);
            ck_assert(o->ids[side] && o->lp[side] && o->tids[side] && o->tlp[side]);
            hx_get(&ids, side, o->ids[side]);
            hx_get(&lp, side, o->lp[side]);
            hx_get(&tids, side, o->tids[side]);
            hx_get(&tlp, side, o->tlp[side]);
        }
    free(fa);
    free(top_k);
    free(seed);
    free(counter);
    hx_free(&L);
    hx_free(&ids);
    hx_free(&lp);
    hx_free(&tids);
    hx_free(&tlp);
}

static int close_or_same_inf(float a, float b, double tol)
{
    if (isinf(a) || isinf(b))
        return a == b;
    return fabs((double)a - (double)b) <= tol;
}

/* Run c, compare both sides with the reference and with each other. Returns how many rows were unambiguous;
 * *ids_out (optional) gets the GPU's ids (caller frees). */
static int32_t check_sample(const struct scase *c, int32_t **ids_out)
{
    const int64_t V = c->V;
    struct sout o;
    berth_status st[2];
    char msg[2][512];
    run_sample(c, &o, st, msg);
    ck_assert_msg(st[HX_CPU] == BERTH_OK, "%s: CPU sample failed: %s", c->name, msg[HX_CPU]);
    ck_assert_msg(st[HX_GPU] == BERTH_OK, "%s: CUDA sample failed: %s", c->name, msg[HX_GPU]);
    float *z = malloc(sizeof *z * (size_t)V);
    ck_assert_ptr_nonnull(z);
    int32_t checked = 0;
    for (int32_t r = 0; r < c->R; r++) {
        const struct rowp *rp = &c->rp[r];
        const int32_t nh = c->hstart ? c->hstart[r + 1] - c->hstart[r] : 0;
        const int32_t n_in = c->out_start ? c->out_start[r] - c->hstart[r] : 0;
        ref_penalise(c->x + (int64_t)r * V, V, rp, c->hist ? c->hist + c->hstart[r] : NULL, nh, n_in, z);
        int amb;
        const int32_t ref = ref_pick(z, V, rp, &amb);
        const int32_t cpu = o.ids[HX_CPU][r], gpu = o.ids[HX_GPU][r];
        ck_assert_msg(gpu >= 0 && gpu < V, "%s row %d: CUDA id %d is outside [0, %" PRId64 ")", c->name, r, gpu, V);
        if (!amb) {
            ck_assert_msg(cpu == ref && gpu == ref,
                          "%s row %d (temp %g top_k %d top_p %g min_p %g rep %g pres %g freq %g): CUDA %d, CPU %d, "
                          "reference %d",
                          c->name, r, (double)rp->temp, rp->top_k, (double)rp->top_p, (double)rp->min_p,
                          (double)rp->rep, (double)rp->pres, (double)rp->freq, gpu, cpu, ref);
            checked++;
        } else {
            fprintf(stderr, "%s row %d: too close to call (CUDA %d, CPU %d, reference %d)\n", c->name, r, gpu, cpu,
                    ref);
        }
        if (c->want_lp && gpu == cpu)
            ck_assert_msg(close_or_same_inf(o.lp[HX_GPU][r], o.lp[HX_CPU][r], 1e-5),
                          "%s row %d: logprob of id %d: CUDA %.9g, CPU %.9g", c->name, r, gpu,
                          (double)o.lp[HX_GPU][r], (double)o.lp[HX_CPU][r]);
        for (int32_t j = 0; j < c->n_top; j++) {
            const int64_t k = (int64_t)r * c->n_top + j;
            ck_assert_msg(o.tids[HX_GPU][k] == o.tids[HX_CPU][k], "%s row %d: top_ids[%d]: CUDA %d, CPU %d", c->name,
                          r, j, o.tids[HX_GPU][k], o.tids[HX_CPU][k]);
            ck_assert_msg(close_or_same_inf(o.tlp[HX_GPU][k], o.tlp[HX_CPU][k], 1e-5),
                          "%s row %d: top_logprobs[%d] (id %d): CUDA %.9g, CPU %.9g", c->name, r, j,
                          o.tids[HX_CPU][k], (double)o.tlp[HX_GPU][k], (double)o.tlp[HX_CPU][k]);
        }
    }
    if (ids_out) {
        *ids_out = o.ids[HX_GPU];
        o.ids[HX_GPU] = NULL;
    }
    free(z);
    sout_free(&o);
    return checked;
}

/* History: each row gets n ids, the first `rep` of them repeats of a few ids (counts > 1), `hot` (if >= 0) twice. */
static void give_history(struct scase *c, int32_t n, int32_t hot_row_id_rank)
{
    c->hist = malloc(sizeof *c->hist * (size_t)(c->R * n + 1));
    c->hstart = malloc(sizeof *c->hstart * (size_t)(c->R + 1));
    ck_assert(c->hist && c->hstart);
    int32_t h = 0;
    for (int32_t r = 0; r < c->R; r++) {
        c->hstart[r] = h;
        const float *x = c->x + (int64_t)r * c->V;
        const int32_t few = (int32_t)(hx_rand_u64() % (uint64_t)c->V);
        for (int32_t i = 0; i < n; i++) {
            int32_t id;
            if (i < 3)
                id = few;                                        /* count 3 */
            else if (i < 5 && hot_row_id_rank >= 0)
                id = rank_id(x, c->V, hot_row_id_rank);          /* the row's best: its penalty moves argmax */
            else
                id = (int32_t)(hx_rand_u64() % (uint64_t)c->V);
            c->hist[h++] = id;
        }
    }
    c->hstart[c->R] = h;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Tests. */

START_TEST(test_greedy_ties)
{
    /* planted ties at the maximum (lower id wins), n_top with ties inside the list; then the fast path (no
     * logprob, no top list, no penalties) and NULL per-row arrays */
    const int64_t Vs[3] = {1000, 37, 4099};
    for (int vi = 0; vi < 3; vi++) {
        const int64_t V = Vs[vi];
        for (int variant = 0; variant < 3; variant++) {
            struct scase c = scase_new("greedy", V, 6, variant == 0 ? 5 : 0, variant == 0, 1.0);
            int32_t expect[6];
            for (int32_t r = 0; r < c.R; r++) {
                float *x = c.x + (int64_t)r * V;
                const int32_t top = rank_id(x, V, 0);
                int32_t other = (int32_t)(hx_rand_u64() % (uint64_t)V);
                if (other == top)
                    other = (top + 1) % (int32_t)V;
                x[other] = x[top];
                expect[r] = other < top ? other : top;
                const int32_t third = rank_id(x, V, 3); /* a tie inside the top 5 as well */
                x[rank_id(x, V, 4)] = x[third];
                c.rp[r].temp = r % 2 ? -1.0f : 0.0f;
                c.rp[r].top_k = r == 2 ? 1 : 0; /* ignored when greedy */
            }
            c.null_arrays = variant == 2;
            c.pad = variant == 1 ? 13 : 0;
            int32_t *ids = NULL;
            check_sample(&c, &ids);
            for (int32_t r = 0; r < c.R; r++)
                ck_assert_msg(ids[r] == expect[r], "greedy V %" PRId64 " variant %d row %d: id %d, expected %d", V,
                              variant, r, ids[r], expect[r]);
            free(ids);
            scase_free(&c);
        }
    }
}
END_TEST

START_TEST(test_greedy_argmax_blocks)
{
    /* The greedy fast path cuts each row into segments (at least 2048 entries — 8192 where rows are whole float4s,
     * V % 4 == 0 and 16-byte aligned, read with float4 loads, when the rows then still make 1024 segments in all —
     * at most 1024 per row; one block each) and merges the segments' bests: ties across a segment boundary and
     * across segments far apart (the lower id wins), the maximum in the last entry and in the first, a row of -inf
     * only (id 0), NaN entries (ranked as -inf); V = 2048 (one segment, no merge), 2049 (a 1-entry-short second
     * segment), 262144 (128 scalar segments: five rows of 32 float4 ones would be too few blocks), 1679360 (205
     * float4 segments of exactly 8192 entries, as a decode step's 32 x 262144 makes), 3000001 (1024
     * segments of 2930 entries, the last one shorter), 3000004 (367 float4 segments of 8176 entries, the last one
     * shorter); packed rows and rows padded by 13 floats (not 16-byte aligned: the scalar loads) and by 4 (16-byte
     * aligned: float4 loads where V allows, the pad's sentinels right behind). */
    const int64_t Vs[6] = {2048, 2049, 262144, 1679360, 3000001, 3000004};
    const int64_t pads[3] = {0, 13, 4};
    for (int vi = 0; vi < 6; vi++)
        for (int pad = 0; pad < 3; pad++) {
            const int64_t V = Vs[vi];
            const int vec = V % 4 == 0 && pads[pad] % 4 == 0 && 5 * ((V + 8191) / 8192) >= 1024; /* float4 path */
            const int64_t min_seg = vec ? 8192 : 2048;
            int64_t nparts = (V + min_seg - 1) / min_seg;
            nparts = nparts > 1024 ? 1024 : nparts;
            int64_t seg = (V + nparts - 1) / nparts; /* the kernel's segment length */
            if (vec)
                seg = (seg + 3) / 4 * 4;
            const int64_t edge = seg < V ? seg : V / 2;   /* first id of segment 1 (or mid-row) */
            struct scase c = scase_new("greedy segments", V, 5, 0, 0, 1.0);
            c.pad = pads[pad];
            int32_t expect[5];
            for (int32_t r = 0; r < c.R; r++) {
                float *x = c.x + (int64_t)r * V;
                float mx = x[0];
                for (int64_t i = 1; i < V; i++)
                    mx = x[i] > mx ? x[i] : mx;
                const float top = mx + 1.0f;
                switch (r) {
                case 0: /* the last entry */
                    x[V - 1] = top;
                    expect[r] = (int32_t)(V - 1);
                    break;
                case 1: /* a tie across the first segment boundary, and a third one in the last entry */
                    x[edge - 1] = x[edge] = x[V - 1] = top;
                    expect[r] = (int32_t)(edge - 1);
                    break;
                case 2: /* -inf everywhere */
                    for (int64_t i = 0; i < V; i++)
                        x[i] = -INFINITY;
                    expect[r] = 0;
                    break;
                case 3: /* NaN in a few places (not the first), the maximum late in the row, tied later still */
                    for (int64_t i = 1; i < V; i += V / 7 + 1)
                        x[i] = NAN;
                    x[V - 2] = x[V - 1] = top;
                    expect[r] = (int32_t)(V - 2);
                    break;
                default: /* the first entry, tied in the middle (another segment when there are several) */
                    x[0] = x[V / 2] = top;
                    expect[r] = 0;
                    break;
                }
            }
            int32_t *ids = NULL;
            check_sample(&c, &ids);
            for (int32_t r = 0; r < c.R; r++)
                ck_assert_msg(ids[r] == expect[r], "greedy segments V %" PRId64 " pad %" PRId64 " row %d: id %d, expected %d",
                              V, pads[pad], r, ids[r], expect[r]);
            free(ids);
            scase_free(&c);
        }
}
END_TEST

START_TEST(test_temperature_only)
{
    const float temps[8] = {0.25f, 0.5f, 0.7f, 1.0f, 1.0f, 1.3f, 2.0f, 5.0f};
    int32_t checked = 0;
    for (int round = 0; round < 3; round++) {
        struct scase c = scase_new("temperature", 3001, 8, 0, 1, 1.0);
        for (int32_t r = 0; r < 8; r++)
            c.rp[r].temp = temps[r];
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 20, "only %d unambiguous rows", checked);
}
END_TEST

START_TEST(test_top_k)
{
    const int64_t V = 1000;
    const int32_t ks[8] = {1, 5, (int32_t)V - 1, (int32_t)V, 2, 50, 5, 997};
    int32_t checked = 0;
    for (int round = 0; round < 3; round++) {
        struct scase c = scase_new("top_k", V, 8, 3, 1, 1.0);
        for (int32_t r = 0; r < 8; r++) {
            c.rp[r].temp = r % 2 ? 1.0f : 0.6f;
            c.rp[r].top_k = ks[r];
            if (r == 6 || r == 7) { /* a tie across the k-th place: the lower id of the pair is kept */
                float *x = c.x + (int64_t)r * V;
                const int32_t kth = rank_id(x, V, ks[r] - 1), next = rank_id(x, V, ks[r]);
                x[next] = x[kth];
                x[rank_id(x, V, ks[r] + 1)] = x[kth]; /* three-way */
            }
        }
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 20, "only %d unambiguous rows", checked);
    /* top-k 1 is the argmax at any temperature, including a planted tie */
    struct scase c = scase_new("top_k 1", 777, 4, 0, 0, 1.0);
    int32_t expect[4];
    for (int32_t r = 0; r < 4; r++) {
        float *x = c.x + (int64_t)r * 777;
        const int32_t top = rank_id(x, 777, 0), other = (top + 100 + r) % 777;
        x[other] = x[top];
        expect[r] = other < top ? other : top;
        c.rp[r].temp = 1.5f;
        c.rp[r].top_k = 1;
    }
    int32_t *ids = NULL;
    check_sample(&c, &ids);
    for (int32_t r = 0; r < 4; r++)
        ck_assert_int_eq(ids[r], expect[r]);
    free(ids);
    scase_free(&c);
}
END_TEST

START_TEST(test_top_p)
{
    const float ps[9] = {0.1f, 0.9f, 1.0f, 0.1f, 0.9f, 1.0f, 0.5f, 0.0f, 0.99f};
    int32_t checked = 0;
    for (int round = 0; round < 3; round++) {
        struct scase c = scase_new("top_p", 2000, 9, 0, 1, 1.0);
        for (int32_t r = 0; r < 9; r++) {
            c.rp[r].temp = r < 3 ? 1.0f : r < 6 ? 0.5f : 0.8f;
            c.rp[r].top_p = ps[r];
        }
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 20, "only %d unambiguous rows", checked);
}
END_TEST

/* A nucleus boundary inside a group of tied ids, with exact probabilities (1/4 each; the rest exp -> 0): top_p
 * 0.6 keeps the three lowest ids of the group, whatever order their values were written in. */
START_TEST(test_top_p_boundary_tie)
{
    const int64_t V = 300;
    struct scase c = scase_new("top_p tie", V, 16, 0, 1, 1.0);
    for (int32_t r = 0; r < c.R; r++) {
        float *x = c.x + (int64_t)r * V;
        for (int64_t i = 0; i < V; i++)
            x[i] = -1000.0f - (float)i; /* exp(-1000 - 0) is 0 in fp32 */
        const int32_t g[4] = {250, 3 + r, 120, 299};
        for (int i = 0; i < 4; i++)
            x[g[i]] = 2.0f;
        c.rp[r].temp = 1.0f;
        c.rp[r].top_p = 0.6f;
    }
    int32_t *ids = NULL;
    const int32_t checked = check_sample(&c, &ids);
    ck_assert_int_ge(checked, 12);
    for (int32_t r = 0; r < c.R; r++)
        ck_assert_msg(ids[r] == 3 + r || ids[r] == 120 || ids[r] == 250, "row %d: id %d is outside the nucleus", r,
                      ids[r]);
    free(ids);
    scase_free(&c);
}
END_TEST

START_TEST(test_min_p)
{
    const float mp[8] = {0.01f, 0.1f, 0.5f, 1.0f, 0.05f, 0.2f, 0.9f, 0.001f};
    int32_t checked = 0;
    for (int round = 0; round < 3; round++) {
        struct scase c = scase_new("min_p", 2000, 8, 0, 1, 1.0);
        for (int32_t r = 0; r < 8; r++) {
            c.rp[r].temp = r % 2 ? 1.0f : 0.7f;
            c.rp[r].min_p = mp[r];
        }
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 20, "only %d unambiguous rows", checked);
}
END_TEST

START_TEST(test_penalties)
{
    /* repeated history ids (counts 2 and 3), the row's best id penalised (moves greedy), each penalty alone and
     * together, greedy and sampled rows, with and without logprobs */
    int32_t checked = 0;
    for (int round = 0; round < 4; round++) {
        struct scase c = scase_new("penalties", 1500, 8, round % 2 ? 4 : 0, round < 2, 1.0);
        give_history(&c, 12, 0);
        for (int32_t r = 0; r < 8; r++) {
            c.rp[r].temp = r < 4 ? 0.0f : 0.9f;
            switch (r % 4) {
            case 0: c.rp[r].rep = 1.7f; break;
            case 1: c.rp[r].pres = 5.0f; break;
            case 2: c.rp[r].freq = 2.5f; break;
            case 3: c.rp[r].rep = 1.3f, c.rp[r].pres = 0.5f, c.rp[r].freq = 0.25f; break;
            }
        }
        c.rp[3].rep = 1.0f, c.rp[3].pres = 0.0f, c.rp[3].freq = 0.0f; /* history present, penalties off */
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 26, "only %d unambiguous rows", checked);
}
END_TEST

/* history_output_start (vLLM's rule): repetition counts the prompt and the output, presence and frequency the
 * output only. First the hand-made rows of the CPU backend's test (test_cpu_sample.c,
 * test_sample_penalties_output_only: exact penalised logits, checked there by hand) — both backends must give the
 * same tokens, ranked lists and logprobs, and the hand-computed greedy tokens; then random histories whose prompt
 * and output share ids, every penalty mix, greedy and sampled rows, output starts at the row's start, end and
 * inside, against the reference. */
START_TEST(test_penalties_output_start)
{
    enum { R = 6, V = 8, H = 7 };
    static const float logits[V] = {1.0f, 2.0f, 4.0f, -2.0f, 3.0f, 3.5f, 1.5f, 2.5f};
    static const int32_t row_hist[H] = {2, 3, 2, 4, 4, 7, 7}; /* prompt 2 3 2 4, output 4 7 7 */
    static const int32_t want_id[R] = {2, 2, 5, 5, 2, 5};
    struct scase c = scase_new("output start (by hand)", V, R, V, 1, 1.0);
    c.hist = malloc(sizeof *c.hist * R * H);
    c.hstart = malloc(sizeof *c.hstart * (R + 1));
    c.out_start = malloc(sizeof *c.out_start * R);
    ck_assert(c.hist && c.hstart && c.out_start);
    for (int32_t r = 0; r < R; r++) {
        memcpy(c.x + (int64_t)r * V, logits, sizeof logits);
        memcpy(c.hist + r * H, row_hist, sizeof row_hist);
        c.hstart[r] = r * H;
        c.out_start[r] = r * H + 4;
    }
    c.hstart[R] = R * H;
    c.out_start[4] = 5 * H; /* row 4: no output yet */
    c.out_start[5] = 5 * H; /* row 5: the whole history is output */
    c.rp[0].pres = 1.0f;
    c.rp[1].freq = 0.75f;
    c.rp[2].rep = 2.0f;
    c.rp[3].rep = 2.0f, c.rp[3].pres = 0.5f, c.rp[3].freq = 0.25f;
    c.rp[4].pres = 1.0f, c.rp[4].freq = 0.75f;
    c.rp[5].pres = 1.0f;
    int32_t *ids = NULL;
    ck_assert_int_eq(check_sample(&c, &ids), R);
    for (int32_t r = 0; r < R; r++)
        ck_assert_msg(ids[r] == want_id[r], "output start (by hand) row %d: id %d, expected %d", r, ids[r],
                      want_id[r]);
    free(ids);
    /* without the array every row falls back to the whole history: presence/frequency hit 2 and 3 as well */
    free(c.out_start);
    c.out_start = NULL;
    check_sample(&c, &ids);
    for (int32_t r = 0; r < R; r++)
        ck_assert_msg(ids[r] == 5, "whole history (by hand) row %d: id %d, expected 5", r, ids[r]);
    free(ids);
    scase_free(&c);

    int32_t checked = 0;
    for (int round = 0; round < 4; round++) {
        struct scase d = scase_new("output start", 1500, 8, round % 2 ? 4 : 0, 1, 1.0);
        give_history(&d, 16, 0); /* ids 0..2 one id three times, 3..4 the row's best: they straddle the start */
        d.out_start = malloc(sizeof *d.out_start * 8);
        ck_assert_ptr_nonnull(d.out_start);
        for (int32_t r = 0; r < 8; r++) {
            static const int32_t at[8] = {2, 4, 0, 16, 1, 3, 8, 15};
            d.out_start[r] = d.hstart[r] + at[(r + round) % 8];
            d.rp[r].temp = r < 4 ? 0.0f : 0.9f;
            switch (r % 4) {
            case 0: d.rp[r].pres = 5.0f; break;
            case 1: d.rp[r].freq = 2.5f; break;
            case 2: d.rp[r].rep = 1.7f, d.rp[r].pres = 0.5f; break;
            case 3: d.rp[r].rep = 1.3f, d.rp[r].pres = 0.5f, d.rp[r].freq = 0.25f; break;
            }
        }
        checked += check_sample(&d, NULL);
        scase_free(&d);
    }
    ck_assert_msg(checked >= 26, "only %d unambiguous rows", checked);
}
END_TEST

START_TEST(test_combined)
{
    int32_t checked = 0;
    for (int round = 0; round < 4; round++) {
        struct scase c = scase_new("combined", 2500, 8, 5, 1, 1.0);
        give_history(&c, 20, round % 2 ? 1 : -1);
        c.pad = round % 2 ? 7 : 0; /* strided rows through the general kernel too */
        for (int32_t r = 0; r < 8; r++) {
            c.rp[r].temp = 0.6f + 0.2f * (float)r;
            c.rp[r].top_k = (int32_t)(10 + 40 * r);
            c.rp[r].top_p = r % 3 ? 0.8f : 0.95f;
            c.rp[r].min_p = r % 2 ? 0.05f : 0.0f;
            c.rp[r].rep = r % 4 ? 1.2f : 1.0f;
            c.rp[r].pres = r % 3 == 1 ? 0.3f : 0.0f;
            c.rp[r].freq = r % 3 == 2 ? 0.1f : 0.0f;
        }
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 26, "only %d unambiguous rows", checked);
}
END_TEST

START_TEST(test_seeds_and_counters)
{
    /* the same row of logits under different (seed, counter) pairs; the same pair again gives the same token */
    const int64_t V = 500;
    struct scase c = scase_new("seeds", V, 32, 0, 1, 0.5);
    for (int32_t r = 1; r < c.R; r++)
        memcpy(c.x + (int64_t)r * V, c.x, sizeof *c.x * (size_t)V);
    for (int32_t r = 0; r < c.R; r++) {
        c.rp[r].temp = 1.0f;
        c.rp[r].seed = r < 16 ? hx_rand_u64() : c.rp[r - 16].seed;
        c.rp[r].counter = r < 16 ? (uint64_t)r * 0x100000001ull : c.rp[r - 16].counter;
    }
    int32_t *ids = NULL;
    const int32_t checked = check_sample(&c, &ids);
    ck_assert_int_ge(checked, 28);
    int distinct = 0;
    for (int32_t r = 0; r < 16; r++) {
        ck_assert_int_eq(ids[r], ids[r + 16]);
        distinct += r > 0 && ids[r] != ids[0];
    }
    ck_assert_msg(distinct > 0, "16 different (seed, counter) pairs all drew token %d", ids[0]);
    free(ids);
    scase_free(&c);
}
END_TEST

START_TEST(test_large_vocab)
{
    /* V = 262144 (Gemma's vocabulary), spread +-16 so the nucleus has a head */
    const int64_t V = 262144;
    int32_t checked = 0;
    for (int round = 0; round < 2; round++) {
        struct scase c = scase_new("V 262144", V, 4, 20, 1, 2.0);
        c.rp[0].temp = 0.0f;
        c.rp[1].temp = 1.0f;
        c.rp[2].temp = 0.8f, c.rp[2].top_k = round ? 50 : 1000, c.rp[2].top_p = 0.9f;
        c.rp[3].temp = 1.0f, c.rp[3].top_p = 0.1f, c.rp[3].min_p = 0.02f;
        if (round) {
            give_history(&c, 64, 0);
            c.rp[1].rep = 1.5f;
            c.rp[3].freq = 0.5f;
        }
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 5, "only %d unambiguous rows", checked);
}
END_TEST

START_TEST(test_small_vocab)
{
    /* V = 37: smaller than a block, not a multiple of anything; n_top up to V */
    const int64_t V = 37;
    const int32_t n_tops[3] = {0, 20, (int32_t)V};
    int32_t checked = 0;
    for (int round = 0; round < 6; round++) {
        struct scase c = scase_new("V 37", V, 3, n_tops[round % 3], round % 2, 4.0);
        c.rp[0].temp = 1.0f, c.rp[0].top_k = (int32_t)V - 1;
        c.rp[1].temp = 0.7f, c.rp[1].top_p = 0.9f, c.rp[1].min_p = 0.01f;
        c.rp[2].temp = round < 3 ? 0.0f : 2.0f, c.rp[2].top_k = 5, c.rp[2].top_p = 0.5f;
        if (round >= 3)
            give_history(&c, 7, 0), c.rp[2].rep = 1.4f, c.rp[0].pres = 1.0f;
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 15, "only %d unambiguous rows", checked);
}
END_TEST

START_TEST(test_n_top)
{
    /* n_top 0 / 5 / 20 with ties inside the lists; a list too long for shared memory (3000 of 5000) */
    const int32_t n_tops[4] = {0, 5, 20, 3000};
    for (int i = 0; i < 4; i++) {
        const int64_t V = i == 3 ? 5000 : 1000;
        struct scase c = scase_new("n_top", V, 5, n_tops[i], 1, 1.0);
        for (int32_t r = 0; r < c.R; r++) {
            float *x = c.x + (int64_t)r * V;
            x[rank_id(x, V, 2)] = x[rank_id(x, V, 1)];
            x[rank_id(x, V, 10)] = x[rank_id(x, V, 7)];
            c.rp[r].temp = r % 2 ? 0.8f : 0.0f;
            c.rp[r].top_k = r == 4 ? 30 : 0;
        }
        if (i == 2)
            give_history(&c, 9, 0), c.rp[1].rep = 2.0f, c.rp[2].pres = 1.0f;
        check_sample(&c, NULL);
        scase_free(&c);
    }
}
END_TEST

START_TEST(test_many_rows)
{
    /* R = 64 rows of mixed settings, own seeds and counters, some with penalties */
    const int64_t V = 5000;
    int32_t checked = 0;
    for (int round = 0; round < 2; round++) {
        struct scase c = scase_new("many rows", V, 64, 5, 1, 1.0);
        give_history(&c, 10, round ? 0 : -1);
        c.pad = round ? 3 : 0;
        for (int32_t r = 0; r < c.R; r++) {
            struct rowp *p = &c.rp[r];
            switch (r % 8) {
            case 0: break;                                                            /* greedy */
            case 1: p->temp = 1.0f; break;
            case 2: p->temp = 0.7f, p->top_k = 40; break;
            case 3: p->temp = 1.1f, p->top_p = 0.9f; break;
            case 4: p->temp = 0.9f, p->min_p = 0.1f; break;
            case 5: p->temp = 0.8f, p->top_k = 200, p->top_p = 0.7f, p->min_p = 0.02f; break;
            case 6: p->temp = 1.0f, p->top_k = 1; break;
            case 7: p->temp = 1.2f, p->top_p = 0.3f; break;
            }
            if (r % 3 == 0)
                p->rep = 1.3f, p->freq = 0.2f;
        }
        checked += check_sample(&c, NULL);
        scase_free(&c);
    }
    ck_assert_msg(checked >= 110, "only %d unambiguous rows", checked);
}
END_TEST

START_TEST(test_sample_errors)
{
    /* the host arrays are checked before anything runs, with the CPU backend's messages */
    const int64_t V = 100;
    struct scase c = scase_new("errors", V, 2, 0, 0, 1.0);
    give_history(&c, 4, -1);
    c.rp[1].rep = 1.5f;
    struct sout o;
    berth_status st[2];
    char msg[2][512];

    c.hist[5] = (int32_t)V; /* row 1's second id */
    run_sample(&c, &o, st, msg);
    ck_assert_int_eq(st[HX_CPU], BERTH_E_INVALID);
    ck_assert_int_eq(st[HX_GPU], BERTH_E_INVALID);
    ck_assert_str_eq(msg[HX_GPU], "sample: history[5] = 100 is not a token id (V = 100)");
    ck_assert_str_eq(msg[HX_GPU], msg[HX_CPU]);
    sout_free(&o);

    c.hist[5] = 0;
    c.hstart[1] = 5, c.hstart[2] = 4;
    run_sample(&c, &o, st, msg);
    ck_assert_int_eq(st[HX_GPU], BERTH_E_INVALID);
    ck_assert_str_eq(msg[HX_GPU], "sample: history_start[1..2] = 5, 4 is not a valid range");
    ck_assert_str_eq(msg[HX_GPU], msg[HX_CPU]);
    sout_free(&o);

    c.hstart[1] = 4, c.hstart[2] = 8;
    c.rp[0].rep = 0.0f;
    run_sample(&c, &o, st, msg);
    ck_assert_int_eq(st[HX_GPU], BERTH_E_INVALID);
    ck_assert_str_eq(msg[HX_GPU], "sample: row 0 repetition_penalty 0 must be > 0");
    ck_assert_str_eq(msg[HX_GPU], msg[HX_CPU]);
    sout_free(&o);

    /* an output start outside its row's history range: the shared check's message on both */
    c.rp[0].rep = 1.0f;
    c.out_start = malloc(sizeof *c.out_start * 2);
    ck_assert_ptr_nonnull(c.out_start);
    c.out_start[0] = 2, c.out_start[1] = 9;
    run_sample(&c, &o, st, msg);
    ck_assert_int_eq(st[HX_CPU], BERTH_E_INVALID);
    ck_assert_int_eq(st[HX_GPU], BERTH_E_INVALID);
    ck_assert_str_eq(msg[HX_GPU], "sample: row 1 history_output_start 9 is outside its history [4, 8]");
    ck_assert_str_eq(msg[HX_GPU], msg[HX_CPU]);
    sout_free(&o);
    free(c.out_start);
    c.out_start = NULL;

    /* min_p > 1 leaves nothing to draw (the CPU backend returns id -1): refused here */
    c.rp[0].rep = 1.0f;
    c.rp[1].temp = 1.0f, c.rp[1].min_p = 1.5f;
    run_sample(&c, &o, st, msg);
    ck_assert_int_eq(st[HX_GPU], BERTH_E_INVALID);
    ck_assert_str_eq(msg[HX_GPU], "sample: row 1 min_p 1.5 must be <= 1");
    sout_free(&o);

    c.rp[1].min_p = 0.0f, c.rp[1].temp = NAN;
    run_sample(&c, &o, st, msg);
    ck_assert_int_eq(st[HX_GPU], BERTH_E_INVALID);
    ck_assert_str_eq(msg[HX_GPU], "sample: row 1 temperature is NaN");
    sout_free(&o);

    /* and a valid call afterwards still works */
    c.rp[1].temp = 1.0f;
    check_sample(&c, NULL);
    scase_free(&c);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * log_softmax_topk */

static void check_lst(int64_t V, int32_t R, int32_t k, int with_bias, int64_t pad)
{
    const int64_t W = V + pad;
    float *x = malloc(sizeof *x * (size_t)(W * R));
    ck_assert_ptr_nonnull(x);
    for (int32_t r = 0; r < R; r++) {
        float *row = x + (int64_t)r * W;
        grid_row(row, V, 1.0);
        for (int64_t i = V; i < W; i++)
            row[i] = 1e4f;
        /* ties: at the top (lower index first) and around the k-th place */
        row[rank_id(row, V, 1)] = row[rank_id(row, V, 0)];
        if (k < V) {
            const int32_t kth = rank_id(row, V, k - 1);
            row[rank_id(row, V, k)] = row[kth];
        }
    }
    struct hx_tensor L = hx_new(BERTH_DTYPE_F32, W, R, 0, 0), bias = hx_new(BERTH_DTYPE_F32, R, 0, 0, 0);
    struct hx_tensor vals = hx_new(BERTH_DTYPE_F32, k, R, 0, 0), idx = hx_new(BERTH_DTYPE_I32, k, R, 0, 0);
    hx_set(&L, x);
    hx_rand(&bias, -3.0f, 0.0f);
    for (int side = 0; side < 2; side++) {
        berth_log_softmax_topk_params p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.k = k;
        p.logits = L.t[side];
        p.logits.ne[0] = V;
        if (with_bias)
            p.row_bias = bias.t[side];
        p.values = vals.t[side];
        p.indices = idx.t[side];
        berth_log_softmax_topk_params q = p;
        q.logits = no_buf(q.logits);
        q.row_bias = no_buf(q.row_bias);
        q.values = no_buf(q.values);
        q.indices = no_buf(q.indices);
        ck_assert_msg(hx_supports(side, BERTH_OP_LOG_SOFTMAX_TOPK, &q) == BERTH_OK, "supports() side %d: %s", side,
                      hx_last_error);
        const berth_status st = hx_op(side, BERTH_OP_LOG_SOFTMAX_TOPK, &p);
        ck_assert_msg(st == BERTH_OK, "log_softmax_topk side %d: %s", side, hx_last_error);
    }
    hx_sync();
    char what[128];
    snprintf(what, sizeof what, "log_softmax_topk V %" PRId64 " R %d k %d bias %d", V, R, k, with_bias);
    hx_expect_equal(&idx, what);
    hx_expect_close(&vals, 1e-5, 0.0, what);
    /* the first two are the planted tie at the top, lower index first */
    int32_t *got = malloc(idx.bytes);
    ck_assert_ptr_nonnull(got);
    hx_get(&idx, HX_GPU, got);
    for (int32_t r = 0; r < R && k >= 2; r++) {
        const int32_t a = got[(int64_t)r * k], b = got[(int64_t)r * k + 1];
        ck_assert_msg(a < b && x[(int64_t)r * W + a] == x[(int64_t)r * W + b], "%s row %d: top two %d, %d", what, r, a,
                      b);
    }
    free(got);
    free(x);
    hx_free(&L);
    hx_free(&bias);
    hx_free(&vals);
    hx_free(&idx);
}

START_TEST(test_log_softmax_topk)
{
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        check_lst(1001, 5, 1, with_bias, 0);
        check_lst(1001, 5, 7, with_bias, 3);
        check_lst(1001, 5, 64, with_bias, 0);
        check_lst(37, 3, 37, with_bias, 0);
        check_lst(5000, 2, 5000, with_bias, 0); /* sorted in global scratch */
        check_lst(262144, 2, 8, with_bias, 0);
    }
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("cuda_sample");
    TCase *tc = tcase_create("sample");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_greedy_ties);
    tcase_add_test(tc, test_greedy_argmax_blocks);
    tcase_add_test(tc, test_temperature_only);
    tcase_add_test(tc, test_top_k);
    tcase_add_test(tc, test_top_p);
    tcase_add_test(tc, test_top_p_boundary_tie);
    tcase_add_test(tc, test_min_p);
    tcase_add_test(tc, test_penalties);
    tcase_add_test(tc, test_penalties_output_start);
    tcase_add_test(tc, test_combined);
    tcase_add_test(tc, test_seeds_and_counters);
    tcase_add_test(tc, test_large_vocab);
    tcase_add_test(tc, test_small_vocab);
    tcase_add_test(tc, test_n_top);
    tcase_add_test(tc, test_many_rows);
    tcase_add_test(tc, test_sample_errors);
    tcase_add_test(tc, test_log_softmax_topk);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return hx_main(argc, argv, make_suite);
}

/*
 * test_cuda_attention.c — the CUDA backend's kv_append and attention against the CPU backend.
 *
 * Each case fills a paged KV pool through kv_append on both backends (same random K/V, norms and RoPE, tokens in
 * shuffled order through a shuffled, non-contiguous block table, one token with slot -1) and compares the pools;
 * then it gives both backends the CPU's pool (so attention sees identical K/V) and compares attention outputs.
 * Cases cover head dims 80/128/192/256/512 (K and V of different widths too), n_rep 1/2/3/4/8, block sizes 16
 * and 32, KV dtypes f32/bf16/f16, three pool layouts (16-byte aligned and not), windows that bite and that do
 * not, decode batches (one split written directly, several splits combined) with per-sequence lengths including
 * 0, prefill chunks, a mixed batch (a chunk starting past position 0 plus decode rows, a sequence with no rows),
 * softcap, gate, MASK_NONE, and negative block-table entries for blocks outside every window.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define MAX_SEQS 6

struct seq_spec {
    int q_len;  /* query rows this step: the last q_len positions of the sequence */
    int kv_len; /* keys in the cache (including this step's) */
};

struct attn_case {
    const char *name;
    berth_dtype kv_dt;
    int D, DV, n_kvh, n_rep, bs;
    int layout; /* 0: per block [K tokens x heads | V tokens x heads]; 1: heads outermost in each part;
                 * 2: per token [K heads | V heads] (V not 16-byte aligned for odd sizes), q a misaligned view;
                 * 3: as 0 with each head's slot padded to 32 bytes (aligned rows of any length) */
    int n_seqs;
    struct seq_spec seqs[MAX_SEQS];
    int mask, window;
    float scale, softcap;
    int gate;
    int k_norm, v_norm;
    berth_dtype norm_dt;
    int rope_mode, rope_off, rope_pairs;
    int drop_outside; /* block-table entries of blocks below every query's window set to -1 before attention */
};

static size_t dt_size(berth_dtype dt)
{
    return dt == BERTH_DTYPE_F32 || dt == BERTH_DTYPE_I32 ? 4 : 2;
}

static int seq_pos(const struct seq_spec *s, int i)
{
    const int p = s->kv_len - s->q_len + i;
    return p > 0 ? p : 0;
}

/* A 3-D view of base (side) at byte offset off. */
static berth_tensor view3(const struct hx_tensor *base, int side, uint64_t off, int64_t ne0, int64_t ne1,
                          int64_t ne2, int64_t nb1, int64_t nb2)
{
    berth_tensor t = base->t[side];
    t.offset += off;
    t.ndim = 3;
    t.ne[0] = ne0, t.ne[1] = ne1, t.ne[2] = ne2, t.ne[3] = 1;
    t.nb[0] = (int64_t)dt_size(t.dtype), t.nb[1] = nb1, t.nb[2] = nb2, t.nb[3] = nb2 * ne2;
    return t;
}

static void shuffle_int(int *v, int n)
{
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(hx_rand_u64() % (uint64_t)(i + 1));
        const int t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

struct pool {
    struct hx_tensor mem;
    berth_kv_view kv; /* without buffers */
    uint64_t v_off;   /* V part's offset inside mem */
};

static void pool_make(struct pool *p, const struct attn_case *c, int n_blocks)
{
    const uint64_t es = dt_size(c->kv_dt), D = (uint64_t)c->D, DV = (uint64_t)c->DV, H = (uint64_t)c->n_kvh,
                   bs = (uint64_t)c->bs;
    const uint64_t kslot = c->layout == 3 ? (D * es + 31) / 32 * 32 : D * es;
    const uint64_t vslot = c->layout == 3 ? (DV * es + 31) / 32 * 32 : DV * es;
    memset(p, 0, sizeof *p);
    p->mem = hx_new(c->kv_dt, (int64_t)(n_blocks * bs * H * (kslot + vslot) / es), 0, 0, 0);
    hx_rand(&p->mem, -1.0f, 1.0f); /* slots kv_append never writes (and padding) must stay equal too */
    berth_kv_view *kv = &p->kv;
    kv->dtype = c->kv_dt;
    kv->block_size = c->bs;
    kv->n_blocks = n_blocks;
    kv->n_kv_heads = c->n_kvh;
    kv->head_dim = c->D;
    kv->head_dim_v = c->DV;
    kv->block_stride = bs * H * (kslot + vslot);
    switch (c->layout) {
    case 0:
    case 3:
        kv->token_stride = H * kslot, kv->head_stride = kslot;
        kv->v_token_stride = H * vslot, kv->v_head_stride = vslot;
        p->v_off = bs * H * kslot;
        break;
    case 1:
        kv->token_stride = D * es, kv->head_stride = bs * D * es;
        kv->v_token_stride = DV * es, kv->v_head_stride = bs * DV * es;
        p->v_off = bs * H * D * es;
        break;
    default:
        kv->token_stride = kv->v_token_stride = H * (D + DV) * es;
        kv->head_stride = D * es, kv->v_head_stride = DV * es;
        p->v_off = H * D * es;
        break;
    }
}

static berth_kv_view pool_view(const struct pool *p, int side)
{
    berth_kv_view kv = p->kv;
    kv.k_buf = kv.v_buf = p->mem.buf[side];
    kv.k_offset = p->mem.t[side].offset;
    kv.v_offset = p->mem.t[side].offset + p->v_off;
    return kv;
}

static double pool_rtol(berth_dtype dt)
{
    /* One unit in the last place of the stored dtype: an fp32 rounding difference (sin/cos, the RMS sum's order)
     * may flip a bf16/f16 rounding. */
    return dt == BERTH_DTYPE_BF16 ? 8e-3 : dt == BERTH_DTYPE_F16 ? 1.5e-3 : 2e-5;
}

static void run_case(const struct attn_case *c)
{
    const int ns = c->n_seqs, H = c->n_kvh * c->n_rep;
    int bt_w = 1, n_blocks = 2, T = 0, T_app = 1, max_q = 0, max_kv = 0;
    for (int i = 0; i < ns; i++) {
        const int nb = (c->seqs[i].kv_len + c->bs - 1) / c->bs;
        bt_w = nb + 1 > bt_w ? nb + 1 : bt_w;
        n_blocks += nb;
        T += c->seqs[i].q_len;
        T_app += c->seqs[i].kv_len;
        max_q = c->seqs[i].q_len > max_q ? c->seqs[i].q_len : max_q;
        max_kv = c->seqs[i].kv_len > max_kv ? c->seqs[i].kv_len : max_kv;
    }

    /* Block table: a shuffled permutation of the pool's blocks; entries past a sequence's length hold values no
     * backend may read (-1 and a huge block number). */
    int *perm = malloc(sizeof(int) * (size_t)n_blocks);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)bt_w * (size_t)ns);
    ck_assert(perm && bt);
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    shuffle_int(perm, n_blocks);
    int next = 0;
    for (int s = 0; s < ns; s++) {
        const int nb = (c->seqs[s].kv_len + c->bs - 1) / c->bs;
        for (int b = 0; b < bt_w; b++)
            bt[s * bt_w + b] = b < nb ? perm[next++] : (b & 1 ? 0x7fffffff : -1);
    }

    struct pool pool;
    pool_make(&pool, c, n_blocks);

    /* ---- kv_append of every key of every sequence, in shuffled order, plus one token with slot -1 ---- */
    int *order = malloc(sizeof(int) * (size_t)T_app);
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)T_app), *apos = malloc(sizeof(int32_t) * (size_t)T_app);
    ck_assert(order && slots && apos);
    {
        int n = 0;
        for (int s = 0; s < ns; s++)
            for (int p = 0; p < c->seqs[s].kv_len; p++)
                order[n++] = s << 20 | p;
        order[n++] = -1;
        shuffle_int(order, T_app);
        for (int t = 0; t < T_app; t++) {
            if (order[t] < 0) {
                slots[t] = -1;
                apos[t] = 7;
                continue;
            }
            const int s = order[t] >> 20, p = order[t] & 0xfffff;
            slots[t] = bt[s * bt_w + p / c->bs] * c->bs + p % c->bs;
            apos[t] = p;
        }
    }
    /* K and V are views into one fused projection output {n_kvh * (D + DV), T_app}. */
    struct hx_tensor kvin = hx_new(BERTH_DTYPE_F32, (int64_t)c->n_kvh * (c->D + c->DV), T_app, 0, 0);
    hx_rand(&kvin, -1.0f, 1.0f);
    struct hx_tensor tslots = hx_new(BERTH_DTYPE_I32, T_app, 0, 0, 0), tapos = hx_new(BERTH_DTYPE_I32, T_app, 0, 0, 0);
    hx_set(&tslots, slots);
    hx_set(&tapos, apos);
    struct hx_tensor knw = hx_new(c->norm_dt, c->D, 0, 0, 0), vnw = hx_new(c->norm_dt, c->DV, 0, 0, 0);
    hx_rand(&knw, c->k_norm == BERTH_NORM_W_ONE_PLUS ? -0.5f : 0.5f, c->k_norm == BERTH_NORM_W_ONE_PLUS ? 0.5f : 1.5f);
    hx_rand(&vnw, c->v_norm == BERTH_NORM_W_ONE_PLUS ? -0.5f : 0.5f, c->v_norm == BERTH_NORM_W_ONE_PLUS ? 0.5f : 1.5f);
    const int npairs = c->rope_pairs > 0 ? c->rope_pairs : 1;
    struct hx_tensor freqs = hx_new(BERTH_DTYPE_F32, npairs, 0, 0, 0);
    {
        float *f = malloc(sizeof(float) * (size_t)npairs);
        ck_assert(f);
        for (int j = 0; j < npairs; j++)
            f[j] = powf(10000.0f, -(float)j / (float)npairs);
        hx_set(&freqs, f);
        free(f);
    }
    const int64_t in_row = (int64_t)c->n_kvh * (c->D + c->DV) * 4;
    for (int side = 0; side < 2; side++) {
        berth_kv_append_params p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.k_norm_mode = c->k_norm;
        p.v_norm_mode = c->v_norm;
        p.eps = 1e-6f;
        p.rope_mode = c->rope_mode;
        p.rope_pair_offset = c->rope_off;
        p.rope_n_pairs = c->rope_pairs;
        p.k = view3(&kvin, side, 0, c->D, c->n_kvh, T_app, (int64_t)c->D * 4, in_row);
        p.v = view3(&kvin, side, (uint64_t)c->n_kvh * c->D * 4, c->DV, c->n_kvh, T_app, (int64_t)c->DV * 4, in_row);
        p.slots = tslots.t[side];
        if (c->k_norm == BERTH_NORM_W || c->k_norm == BERTH_NORM_W_ONE_PLUS)
            p.k_norm = knw.t[side];
        if (c->v_norm == BERTH_NORM_W || c->v_norm == BERTH_NORM_W_ONE_PLUS)
            p.v_norm = vnw.t[side];
        if (c->rope_pairs > 0) {
            p.positions = tapos.t[side];
            p.rope_freqs = freqs.t[side];
        }
        p.kv = pool_view(&pool, side);
        const berth_status st = hx_op(side, BERTH_OP_KV_APPEND, &p);
        ck_assert_msg(st == BERTH_OK, "%s: kv_append on %s: status %d: %s", c->name, side ? "cuda" : "cpu", st,
                      hx_last_error);
    }
    hx_sync();
    char what[640];
    snprintf(what, sizeof what, "%s: KV pool after kv_append", c->name);
    hx_expect_close(&pool.mem, 1e-5, pool_rtol(c->kv_dt), what);

    /* Both backends attend over the CPU's pool. */
    {
        void *bytes = malloc(pool.mem.bytes);
        ck_assert(bytes);
        hx_get(&pool.mem, HX_CPU, bytes);
        hx_set(&pool.mem, bytes);
        free(bytes);
    }

    /* ---- attention ---- */
    int32_t *qpos = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
    int32_t *qstart = malloc(sizeof(int32_t) * (size_t)(ns + 1)), *kvlen = malloc(sizeof(int32_t) * (size_t)ns);
    ck_assert(qpos && qstart && kvlen);
    qstart[0] = 0;
    for (int s = 0; s < ns; s++) {
        for (int i = 0; i < c->seqs[s].q_len; i++)
            qpos[qstart[s] + i] = seq_pos(&c->seqs[s], i);
        qstart[s + 1] = qstart[s] + c->seqs[s].q_len;
        kvlen[s] = c->seqs[s].kv_len;
        if (c->drop_outside && c->mask == BERTH_MASK_CAUSAL && c->window > 0 && c->seqs[s].q_len > 0) {
            const int lo = seq_pos(&c->seqs[s], 0) - c->window + 1; /* rows' positions rise: row 0 sees least */
            for (int b = 0; b < bt_w && (b + 1) * c->bs <= lo; b++)
                bt[s * bt_w + b] = -1;
        }
    }
    /* q: contiguous, or (layout 2) a view whose rows are not 16-byte aligned */
    const int qmis = c->layout == 2;
    struct hx_tensor q = hx_new(BERTH_DTYPE_F32, c->D + qmis, H, T, 0), out = hx_new(BERTH_DTYPE_F32, c->DV, H, T, 0);
    struct hx_tensor gate = hx_new(BERTH_DTYPE_F32, c->DV, H, T, 0);
    struct hx_tensor tpos = hx_new(BERTH_DTYPE_I32, T > 0 ? T : 1, 0, 0, 0);
    struct hx_tensor tqs = hx_new(BERTH_DTYPE_I32, ns + 1, 0, 0, 0), tkv = hx_new(BERTH_DTYPE_I32, ns, 0, 0, 0);
    struct hx_tensor tbt = hx_new(BERTH_DTYPE_I32, bt_w, ns, 0, 0);
    hx_rand(&q, -0.5f, 0.5f);
    hx_rand(&gate, -3.0f, 3.0f);
    hx_set(&tpos, qpos);
    hx_set(&tqs, qstart);
    hx_set(&tkv, kvlen);
    hx_set(&tbt, bt);
    for (int side = 0; side < 2; side++) {
        berth_attention_params p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.mask = c->mask;
        p.window = c->window;
        p.scale = c->scale;
        p.softcap = c->softcap;
        p.n_seqs = ns;
        p.max_q_len = max_q;
        p.max_kv_len = max_kv;
        p.q = view3(&q, side, qmis ? 4 : 0, c->D, H, T, (int64_t)(c->D + qmis) * 4, (int64_t)(c->D + qmis) * 4 * H);
        p.out = out.t[side];
        if (c->gate)
            p.gate = gate.t[side];
        p.positions = tpos.t[side];
        p.seq_q_start = tqs.t[side];
        p.seq_kv_len = tkv.t[side];
        p.block_table = tbt.t[side];
        p.kv = pool_view(&pool, side);
        const berth_status st = hx_op(side, BERTH_OP_ATTENTION, &p);
        ck_assert_msg(st == BERTH_OK, "%s: attention on %s: status %d: %s", c->name, side ? "cuda" : "cpu", st,
                      hx_last_error);
    }
    hx_sync();
    /* Both sides accumulate fp32 dot products in different orders; the score error grows with the score's size,
     * about scale * sqrt(D) for unit-RMS q and k (Gemma: scale 1, D 512 -> ~1e-5 seen in outputs), and reaches the
     * output through e^score. A wrong key, weight or mask costs 1e-3 or more. */
    const double tol = 2e-5 * fmax(1.0, c->scale * sqrt((double)c->D) / 4.0);
    snprintf(what, sizeof what, "%s: attention output", c->name);
    hx_expect_close(&out, tol, tol, what);

    /* Rows of sequences without keys are exactly zero (not merely close). */
    {
        float *o = malloc(sizeof(float) * (size_t)c->DV * (size_t)H * (size_t)(T > 0 ? T : 1));
        ck_assert(o);
        hx_get_f32(&out, HX_GPU, o);
        for (int s = 0; s < ns; s++) {
            if (c->seqs[s].kv_len != 0)
                continue;
            for (int64_t i = (int64_t)qstart[s] * H * c->DV; i < (int64_t)qstart[s + 1] * H * c->DV; i++)
                ck_assert_msg(o[i] == 0.0f, "%s: seq %d has no keys but out[%lld] = %g", c->name, s, (long long)i,
                              (double)o[i]);
        }
        free(o);
    }

    hx_free(&q);
    hx_free(&out);
    hx_free(&gate);
    hx_free(&tpos);
    hx_free(&tqs);
    hx_free(&tkv);
    hx_free(&tbt);
    hx_free(&kvin);
    hx_free(&tslots);
    hx_free(&tapos);
    hx_free(&knw);
    hx_free(&vnw);
    hx_free(&freqs);
    hx_free(&pool.mem);
    free(qpos);
    free(qstart);
    free(kvlen);
    free(order);
    free(slots);
    free(apos);
    free(perm);
    free(bt);
}

#define F32 BERTH_DTYPE_F32
#define BF16 BERTH_DTYPE_BF16
#define F16 BERTH_DTYPE_F16
#define CAUSAL BERTH_MASK_CAUSAL
#define NOMASK BERTH_MASK_NONE
#define HALF BERTH_ROPE_HALF
#define INTERL BERTH_ROPE_INTERLEAVED

/* name, kv dtype, D, DV, n_kvh, n_rep, bs, layout, n_seqs, {q_len, kv_len}..., mask, window, scale, softcap, gate,
 * k_norm, v_norm, norm dtype, rope mode, pair offset, pairs, drop_outside */
static const struct attn_case cases[] = {
    /* prefill (T != n_seqs) */
    {"prefill d256 bf16 rep8 bs16 window 40 (bites)",
     BF16, 256, 256, 1, 8, 16, 0, 1, {{150, 150}},
     CAUSAL, 40, 1.0f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 0},
    {"prefill d512 f32 rep2 bs32, two seqs, a chunk at 67",
     F32, 512, 512, 2, 2, 32, 1, 2, {{70, 70}, {33, 100}},
     CAUSAL, 0, 1.0f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, F32, HALF, 256, 64, 0},
    {"prefill d512 bf16 rep8 bs16 window 512 (does not bite)",
     BF16, 512, 512, 1, 8, 16, 0, 1, {{130, 130}},
     CAUSAL, 512, 1.0f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 256, 64, 0},
    {"prefill d80 f16 rep1 softcap gate, a seq with no rows",
     F16, 80, 80, 3, 1, 16, 2, 3, {{40, 40}, {0, 10}, {25, 25}},
     CAUSAL, 512, 0.1118034f, 5.0f, 1, BERTH_NORM_W_ONE_PLUS, BERTH_NORM_W_NONE, F16, INTERL, 0, 40, 0},
    {"prefill d100 bf16 rep2 unaligned K/V and q, window 30",
     BF16, 100, 100, 2, 2, 16, 2, 2, {{70, 70}, {12, 50}},
     CAUSAL, 30, 0.1f, 0.0f, 1, BERTH_NORM_UNIT, BERTH_NORM_W, F32, HALF, 50, 50, 0},
    {"prefill d192/dv128 f32 rep2",
     F32, 192, 128, 2, 2, 32, 0, 2, {{65, 65}, {20, 90}},
     CAUSAL, 0, 0.0721688f, 0.0f, 0, BERTH_NORM_W_NONE, BERTH_NORM_W_NONE, F32, HALF, 96, 32, 0},
    {"MASK_NONE prefill d128 bf16 rep4 bs32",
     BF16, 128, 128, 2, 4, 32, 1, 3, {{20, 45}, {7, 3}, {1, 0}},
     NOMASK, 0, 0.088388f, 0.0f, 0, BERTH_NORM_W_NONE, BERTH_NORM_W_NONE, F32, HALF, 0, 0, 0},
    {"prefill d100 f16 rep4 padded head slots (partial 16-byte vectors)",
     F16, 100, 100, 1, 4, 32, 3, 2, {{50, 80}, {30, 30}},
     CAUSAL, 0, 0.1f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, F16, HALF, 50, 50, 0},
    /* mixed */
    {"mixed: chunk at 53 + two decode rows + an empty seq, window 64, dropped blocks",
     F32, 256, 256, 1, 8, 16, 0, 4, {{37, 90}, {1, 200}, {0, 5}, {1, 17}},
     CAUSAL, 64, 1.0f, 0.0f, 1, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 1},
    /* decode (T == n_seqs) */
    {"decode d256 bf16 rep8 bs16 window 64 (bites), dropped blocks, lengths 300/0/1/129/513",
     BF16, 256, 256, 1, 8, 16, 0, 5, {{1, 300}, {1, 0}, {1, 1}, {1, 129}, {1, 513}},
     CAUSAL, 64, 1.0f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 1},
    {"decode d512 f16 rep2 bs32 no window, lengths 77/1000/0",
     F16, 512, 512, 2, 2, 32, 1, 3, {{1, 77}, {1, 1000}, {1, 0}},
     CAUSAL, 0, 1.0f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, F32, HALF, 256, 64, 0},
    {"decode d512 bf16 rep8 window 512 (bites), softcap, gate",
     BF16, 512, 512, 1, 8, 16, 0, 2, {{1, 700}, {1, 300}},
     CAUSAL, 512, 1.0f, 30.0f, 1, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 256, 64, 1},
    {"decode d80 f32 rep3 short (one split, direct), softcap, gate",
     F32, 80, 80, 2, 3, 16, 2, 3, {{1, 5}, {1, 64}, {1, 30}},
     CAUSAL, 0, 0.1118034f, 3.0f, 1, BERTH_NORM_W_ONE_PLUS, BERTH_NORM_W_NONE, BF16, INTERL, 0, 16, 0},
    {"decode d256 f32 rep1 bs32 many seqs",
     F32, 256, 256, 4, 1, 32, 1, 6, {{1, 33}, {1, 400}, {1, 2}, {1, 64}, {1, 65}, {1, 250}},
     CAUSAL, 0, 0.0625f, 0.0f, 0, BERTH_NORM_UNIT, BERTH_NORM_UNIT, F32, HALF, 128, 128, 0},
    {"decode d192/dv128 bf16 rep4 window 100",
     BF16, 192, 128, 1, 4, 16, 2, 2, {{1, 150}, {1, 90}},
     CAUSAL, 100, 0.0721688f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_W_NONE, F32, HALF, 96, 32, 1},
    {"decode d100/dv84 f32 rep2 padded head slots (partial 16-byte vectors)",
     F32, 100, 84, 2, 2, 16, 3, 3, {{1, 40}, {1, 100}, {1, 7}},
     CAUSAL, 0, 0.1f, 0.0f, 1, BERTH_NORM_UNIT, BERTH_NORM_W, F32, INTERL, 0, 50, 0},
    {"MASK_NONE decode d128 f16 rep2",
     F16, 128, 128, 2, 2, 16, 0, 2, {{1, 50}, {1, 9}},
     NOMASK, 0, 0.088388f, 0.0f, 1, BERTH_NORM_W_NONE, BERTH_NORM_W_NONE, F32, HALF, 0, 0, 0},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

START_TEST(attention_matches_cpu)
{
    run_case(&cases[_i]);
}
END_TEST

static int rnd(int n)
{
    return (int)(hx_rand_u64() % (uint64_t)n);
}

/* A random valid configuration (sizes kept small: the CPU side must stay quick). The name spells it out. */
static void random_case(struct attn_case *c, char *name, size_t name_size)
{
    static const int dims[] = {64, 80, 96, 100, 128, 256, 512};
    static const int reps[] = {1, 2, 3, 4, 8, 16};
    static const berth_dtype dts[] = {F32, BF16, F16};
    memset(c, 0, sizeof *c);
    c->kv_dt = dts[rnd(3)];
    c->D = dims[rnd(7)];
    c->DV = rnd(3) == 0 ? dims[rnd(7)] : c->D;
    c->n_rep = reps[rnd(6)];
    c->n_kvh = c->n_rep >= 8 ? 1 : 1 + rnd(3);
    c->bs = 8 << rnd(3);
    c->layout = rnd(4);
    c->n_seqs = 1 + rnd(4);
    const int decode = rnd(2);
    int T = 0;
    for (int i = 0; i < c->n_seqs; i++) {
        c->seqs[i].kv_len = rnd(4) == 0 ? rnd(8) : rnd(300);
        c->seqs[i].q_len = decode ? 1 : rnd(25);
        T += c->seqs[i].q_len;
    }
    if (T == 0)
        c->seqs[0].q_len = 1;
    c->mask = rnd(5) == 0 ? NOMASK : CAUSAL;
    c->window = c->mask == CAUSAL && rnd(2) ? 1 + rnd(200) : 0;
    c->scale = rnd(2) ? 1.0f : 1.0f / sqrtf((float)c->D);
    c->softcap = rnd(3) == 0 ? 10.0f : 0.0f;
    c->gate = rnd(2);
    c->k_norm = rnd(4);
    c->v_norm = rnd(4);
    c->norm_dt = dts[rnd(3)];
    if (rnd(3) != 0) {
        c->rope_mode = rnd(2) ? HALF : INTERL;
        c->rope_pairs = 1 + rnd(c->D / 2);
        c->rope_off = c->rope_mode == HALF ? c->rope_pairs + rnd(c->D - 2 * c->rope_pairs + 1) : 0;
    }
    c->drop_outside = rnd(2);
    int n = snprintf(name, name_size, "random: %s D %d DV %d kvh %d rep %d bs %d layout %d mask %d window %d scale %g "
                     "softcap %g gate %d norms %d/%d (dtype %d) rope %d/%d/%d drop %d seqs",
                     c->kv_dt == F32 ? "f32" : c->kv_dt == BF16 ? "bf16" : "f16", c->D, c->DV, c->n_kvh, c->n_rep,
                     c->bs, c->layout, c->mask, c->window, (double)c->scale, (double)c->softcap, c->gate, c->k_norm,
                     c->v_norm, (int)c->norm_dt, c->rope_mode, c->rope_off, c->rope_pairs, c->drop_outside);
    for (int i = 0; i < c->n_seqs && n > 0 && (size_t)n < name_size; i++)
        n += snprintf(name + n, name_size - (size_t)n, " %d/%d", c->seqs[i].q_len, c->seqs[i].kv_len);
    c->name = name;
}

START_TEST(attention_random_matches_cpu)
{
    char name[512];
    struct attn_case c;
    random_case(&c, name, sizeof name);
    run_case(&c);
}
END_TEST

/* kv_append: a slot beyond the pool is skipped on the GPU (its kernel never writes out of bounds; the CPU
 * backend reports it instead), and the other tokens are still written: the pool equals the CPU's with -1 there. */
START_TEST(kv_append_slot_past_pool_skipped)
{
    const struct attn_case c = {"slot past pool", BF16, 64, 64, 2, 1, 16, 0, 0, {{0, 0}}, CAUSAL, 0, 1.0f, 0.0f, 0,
                                BERTH_NORM_W_NONE, BERTH_NORM_W_NONE, F32, HALF, 0, 0, 0};
    const int n_blocks = 3, T = 4;
    struct pool pool;
    pool_make(&pool, &c, n_blocks);
    struct hx_tensor k = hx_new(F32, c.D, c.n_kvh, T, 0), v = hx_new(F32, c.DV, c.n_kvh, T, 0);
    hx_rand(&k, -1.0f, 1.0f);
    hx_rand(&v, -1.0f, 1.0f);
    const int32_t cpu_slots[4] = {5, -1, 47, -1}, gpu_slots[4] = {5, 48, 47, 0x7fffffff};
    struct hx_tensor cs = hx_new(BERTH_DTYPE_I32, T, 0, 0, 0), gs = hx_new(BERTH_DTYPE_I32, T, 0, 0, 0);
    hx_set(&cs, cpu_slots);
    hx_set(&gs, gpu_slots);
    for (int side = 0; side < 2; side++) {
        berth_kv_append_params p;
        memset(&p, 0, sizeof p);
        p.struct_size = sizeof p;
        p.k = k.t[side];
        p.v = v.t[side];
        p.slots = side == HX_CPU ? cs.t[side] : gs.t[side];
        p.kv = pool_view(&pool, side);
        const berth_status st = hx_op(side, BERTH_OP_KV_APPEND, &p);
        ck_assert_msg(st == BERTH_OK, "kv_append on %s: status %d: %s", side ? "cuda" : "cpu", st, hx_last_error);
    }
    hx_sync();
    hx_expect_equal(&pool.mem, "kv_append with slots past the pool (GPU) vs -1 (CPU)");
    hx_free(&k);
    hx_free(&v);
    hx_free(&cs);
    hx_free(&gs);
    hx_free(&pool.mem);
}
END_TEST

/* Shapes the CUDA kernels do not take are refused by supports() (tensor buffers NULL) with a message. */
static berth_tensor qtensor(berth_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = 3;
    t.ne[0] = ne0, t.ne[1] = ne1, t.ne[2] = ne2, t.ne[3] = 1;
    t.nb[0] = (int64_t)dt_size(dt), t.nb[1] = t.nb[0] * ne0, t.nb[2] = t.nb[1] * ne1, t.nb[3] = t.nb[2] * ne2;
    return t;
}

static berth_attention_params query_params(int D, int H, int n_kvh)
{
    berth_attention_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.scale = 1.0f;
    p.n_seqs = 2;
    p.max_q_len = 1;
    p.max_kv_len = 64;
    p.q = qtensor(F32, D, H, 2);
    p.out = qtensor(F32, D, H, 2);
    p.positions = qtensor(BERTH_DTYPE_I32, 2, 1, 1);
    p.seq_q_start = qtensor(BERTH_DTYPE_I32, 3, 1, 1);
    p.seq_kv_len = qtensor(BERTH_DTYPE_I32, 2, 1, 1);
    p.block_table = qtensor(BERTH_DTYPE_I32, 4, 2, 1);
    p.kv.dtype = BF16;
    p.kv.block_size = 16;
    p.kv.n_blocks = 8;
    p.kv.n_kv_heads = n_kvh;
    p.kv.head_dim = D;
    p.kv.head_dim_v = D;
    p.kv.token_stride = (uint64_t)n_kvh * D * 2;
    p.kv.head_stride = (uint64_t)D * 2;
    p.kv.v_token_stride = p.kv.token_stride;
    p.kv.v_head_stride = p.kv.head_stride;
    p.kv.block_stride = 16 * p.kv.token_stride * 2;
    return p;
}

START_TEST(attention_supports_limits)
{
    berth_attention_params p = query_params(256, 8, 1);
    ck_assert_msg(hx_supports(HX_GPU, BERTH_OP_ATTENTION, &p) == BERTH_OK, "a Gemma-like shape: %s", hx_last_error);
    p = query_params(640, 8, 1);
    ck_assert_int_eq(hx_supports(HX_GPU, BERTH_OP_ATTENTION, &p), BERTH_E_UNSUPPORTED);
    ck_assert_msg(strstr(hx_last_error, "640") != NULL, "message names the head dim: %s", hx_last_error);
    p = query_params(128, 32, 1);
    ck_assert_int_eq(hx_supports(HX_GPU, BERTH_OP_ATTENTION, &p), BERTH_E_UNSUPPORTED);
    ck_assert_msg(strstr(hx_last_error, "32") != NULL, "message names the head ratio: %s", hx_last_error);
    p = query_params(128, 8, 2);
    p.mask = BERTH_MASK_NONE;
    p.window = 16;
    for (int side = 0; side < 2; side++)
        ck_assert_int_eq(hx_supports(side, BERTH_OP_ATTENTION, &p), BERTH_E_UNSUPPORTED);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("cuda_ops_attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, attention_matches_cpu, 0, N_CASES);
    tcase_add_loop_test(tc, attention_random_matches_cpu, 0, 8);
    tcase_add_test(tc, kv_append_slot_past_pool_skipped);
    tcase_add_test(tc, attention_supports_limits);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return hx_main(argc, argv, make_suite);
}

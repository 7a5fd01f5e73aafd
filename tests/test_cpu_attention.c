/*
 * test_cpu_attention.c — CPU backend plugin: the paged KV cache (kv_append) and attention over it.
 * Harness and conventions: test_cpu_harness.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_cpu_harness.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Paged KV pool: one buffer, each block a K plane then a V plane ([block][K: slot][head][hd] [V: slot][head][hdv]),
 * K and V with their own head and token strides (each with a gap, and different from each other, so an op that
 * addressed V with K's strides would fail), gaps between blocks. */

struct pool {
    struct tt mem;
    berth_kv_view kv;
};

static char *kv_addr(const struct pool *p, int is_v, int32_t block, int32_t slot, int32_t head, int32_t i)
{
    const size_t es = dt_size(p->kv.dtype);
    if (is_v)
        return p->mem.host + p->kv.v_offset + block * p->kv.block_stride + slot * p->kv.v_token_stride +
               head * p->kv.v_head_stride + i * es;
    return p->mem.host + p->kv.k_offset + block * p->kv.block_stride + slot * p->kv.token_stride +
           head * p->kv.head_stride + i * es;
}

static struct pool pool_new(berth_dtype dt, int32_t n_blocks, int32_t bs, int32_t hkv, int32_t hd, int32_t hdv)
{
    struct pool p;
    const size_t es = dt_size(dt);
    memset(&p.kv, 0, sizeof p.kv);
    p.kv.dtype = dt;
    p.kv.block_size = bs;
    p.kv.n_blocks = n_blocks;
    p.kv.n_kv_heads = hkv;
    p.kv.head_dim = hd;
    p.kv.head_dim_v = hdv;
    p.kv.head_stride = (uint64_t)(hd + 1) * es;
    p.kv.token_stride = (uint64_t)hkv * p.kv.head_stride + 4 * es;
    p.kv.v_head_stride = (uint64_t)(hdv + 2) * es;
    p.kv.v_token_stride = (uint64_t)hkv * p.kv.v_head_stride + 2 * es;
    p.kv.k_offset = 0;
    p.kv.v_offset = (uint64_t)bs * p.kv.token_stride;
    p.kv.block_stride = p.kv.v_offset + (uint64_t)bs * p.kv.v_token_stride + 64;
    p.mem = tt_new(BERTH_DTYPE_U8, (int64_t)p.kv.block_stride * n_blocks, 1, 1, 1, 0);
    p.kv.k_buf = p.kv.v_buf = p.mem.buf;
    /* random values in every K and V element (finite numbers of the dtype) */
    for (int32_t b = 0; b < n_blocks; b++)
        for (int32_t s = 0; s < bs; s++)
            for (int32_t h = 0; h < hkv; h++)
                for (int32_t i = 0; i < hd + hdv; i++) {
                    char *q = kv_addr(&p, i >= hd, b, s, h, i >= hd ? i - hd : i);
                    const float v = (float)urand(-1, 1);
                    if (dt == BERTH_DTYPE_F32)
                        memcpy(q, &v, 4);
                    else {
                        const uint16_t x = dt == BERTH_DTYPE_BF16 ? f_bf16(v) : f_f16(v);
                        memcpy(q, &x, 2);
                    }
                }
    return p;
}

static double kv_get(const struct pool *p, int is_v, int32_t block, int32_t slot, int32_t head, int32_t i)
{
    const char *q = kv_addr(p, is_v, block, slot, head, i);
    uint16_t h;
    float f;
    if (p->kv.dtype == BERTH_DTYPE_F32) {
        memcpy(&f, q, 4);
        return f;
    }
    memcpy(&h, q, 2);
    return p->kv.dtype == BERTH_DTYPE_BF16 ? bf16_f(h) : f16_f(h);
}
/* Relative precision of a KV dtype (one ulp). */
static double kv_ulp(berth_dtype dt)
{
    return dt == BERTH_DTYPE_F32 ? 1e-6 : dt == BERTH_DTYPE_BF16 ? 0x1p-7 : 0x1p-10;
}

/* ---------------------------------------------------------------------------------------------------------------
 * kv_append */

static int has_weight(int mode)
{
    return mode == BERTH_NORM_W || mode == BERTH_NORM_W_ONE_PLUS;
}

static void kv_append_case(berth_dtype kdt, int kmode, int vmode, int rope_mode, int32_t n_pairs, int32_t pair_offset)
{
    const int32_t BS = 4, NB = 6, HKV = 2, HD = 32, HDV = 16, T = 7;
    struct pool pl = pool_new(kdt, NB, BS, HKV, HD, HDV);
    struct tt k = tt_new(BERTH_DTYPE_F32, HD, HKV, T, 1, 1), v = tt_new(BERTH_DTYPE_F32, HDV, HKV, T, 1, 2);
    struct tt kn = tt_new(wdts[kmode % 3], HD, 1, 1, 1, 0), vn = tt_new(wdts[(vmode + 1) % 3], HDV, 1, 1, 1, 0);
    struct tt freqs = tt_new(BERTH_DTYPE_F32, n_pairs ? n_pairs : 1, 1, 1, 1, 0);
    trand(&k.t, -2, 2);
    trand(&v.t, -2, 2);
    trand(&kn.t, -0.5, 0.5);
    trand(&vn.t, -0.5, 0.5);
    trand(&freqs.t, 0.001, 1);
    /* distinct random slots, one skipped */
    int32_t perm[24], slotv[7], posv[7];
    for (int i = 0; i < NB * BS; i++)
        perm[i] = i;
    for (int i = NB * BS - 1; i > 0; i--) {
        const int j = irand(0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int t = 0; t < T; t++) {
        slotv[t] = perm[t];
        posv[t] = irand(0, 3000);
    }
    slotv[2] = -1;
    struct tt slots = ivec(slotv, T), pos = ivec(posv, T);
    tsnap(&pl.mem);
    const float eps = 1e-6f;
    berth_kv_append_params p = {
        .struct_size = sizeof p, .k_norm_mode = kmode, .v_norm_mode = vmode, .eps = eps, .rope_mode = rope_mode,
        .rope_pair_offset = pair_offset, .rope_n_pairs = n_pairs, .k = k.t, .v = v.t, .slots = slots.t,
        /* UNIT and W_NONE take no weight: absent, as a caller passes it */
        .k_norm = has_weight(kmode) ? kn.t : absent, .v_norm = has_weight(vmode) ? vn.t : absent,
        .positions = n_pairs ? pos.t : absent,
        .rope_freqs = n_pairs ? freqs.t : absent, .kv = pl.kv};
    ck_assert_int_eq(vt->supports(be, BERTH_OP_KV_APPEND, &p), BERTH_OK);
    CHECK(ops->kv_append(be, st, &p) == BERTH_OK, "%s", g_last_error);

    unsigned char *written = calloc(pl.mem.bytes, 1);
    for (int t = 0; t < T; t++) {
        if (slotv[t] < 0)
            continue;
        const int32_t b = slotv[t] / BS, s = slotv[t] % BS;
        for (int32_t h = 0; h < HKV; h++)
            for (int is_v = 0; is_v < 2; is_v++) {
                const int32_t n = is_v ? HDV : HD;
                const int mode = is_v ? vmode : kmode;
                const berth_tensor *src = is_v ? &v.t : &k.t, *w = is_v ? &vn.t : &kn.t;
                double r[32], ss = 0;
                for (int32_t i = 0; i < n; i++) {
                    r[i] = tget(src, i, h, t, 0);
                    ss += r[i] * r[i];
                }
                if (mode != BERTH_NORM_W_NONE) /* W_NONE: stored as given; UNIT: normalised, no weight */
                    for (int32_t i = 0; i < n; i++) {
                        const double wi = tget(w, i, 0, 0, 0);
                        const double f = mode == BERTH_NORM_W ? wi : mode == BERTH_NORM_W_ONE_PLUS ? 1 + wi : 1;
                        r[i] = r[i] / sqrt(ss / n + eps) * f;
                    }
                if (!is_v)
                    for (int32_t j = 0; j < n_pairs; j++) {
                        const float a = (float)posv[t] * (float)tget(&freqs.t, j, 0, 0, 0);
                        const int32_t i0 = rope_mode == BERTH_ROPE_HALF ? j : 2 * j;
                        const int32_t i1 = rope_mode == BERTH_ROPE_HALF ? j + pair_offset : 2 * j + 1;
                        const double x0 = r[i0], x1 = r[i1];
                        r[i0] = x0 * cos(a) - x1 * sin(a);
                        r[i1] = x1 * cos(a) + x0 * sin(a);
                    }
                for (int32_t i = 0; i < n; i++) {
                    const double got = kv_get(&pl, is_v, b, s, h, i);
                    check_close(got, r[i], fabs(r[i]), kdt == BERTH_DTYPE_F32 ? 1e-5 : kv_ulp(kdt),
                                is_v ? "kv_append V" : "kv_append K", i, h, t, kdt);
                    memset(written + (kv_addr(&pl, is_v, b, s, h, i) - pl.mem.host), 1, dt_size(kdt));
                }
            }
    }
    for (size_t i = 0; i < pl.mem.bytes; i++)
        CHECK(written[i] || (unsigned char)pl.mem.host[i] == pl.mem.shadow[i], "kv_append wrote byte %zu of the pool", i);
    free(written);

    slotv[4] = NB * BS;
    tset(&slots.t, 4, 0, 0, 0, NB * BS);
    expect_error(ops->kv_append(be, st, &p), BERTH_E_INVALID, "kv_append: slots[4] = 24 is outside the pool (0..23)");
    tt_free(&pl.mem);
    tt_free(&k);
    tt_free(&v);
    tt_free(&kn);
    tt_free(&vn);
    tt_free(&freqs);
    tt_free(&slots);
    tt_free(&pos);
}

/* The query side (ABI 0.5): kv_append with q writes over q exactly what rms_norm with the same weight, eps and
 * RoPE writes (byte for byte), for every token including a skipped slot's, leaves the bytes between q's rows
 * alone, and stores K/V as without it. Bad q shapes and a missing weight fail with their reason. */
static void kv_append_q_case(int qmode, int rope_mode, int32_t n_pairs, int32_t pair_offset)
{
    const int32_t BS = 4, NB = 6, HKV = 2, HD = 32, HDV = 16, T = 5, HQ = 6;
    struct pool pl = pool_new(BERTH_DTYPE_BF16, NB, BS, HKV, HD, HDV), pl2 = pool_new(BERTH_DTYPE_BF16, NB, BS, HKV,
                                                                                      HD, HDV);
    memcpy(pl2.mem.host, pl.mem.host, pl.mem.bytes);
    struct tt k = tt_new(BERTH_DTYPE_F32, HD, HKV, T, 1, 1), v = tt_new(BERTH_DTYPE_F32, HDV, HKV, T, 1, 0);
    struct tt q = tt_new(BERTH_DTYPE_F32, HD, HQ, T, 1, 3), ref = tt_new(BERTH_DTYPE_F32, HD, HQ, T, 1, 3);
    struct tt kn = tt_new(BERTH_DTYPE_BF16, HD, 1, 1, 1, 0), qn = tt_new(BERTH_DTYPE_F16, HD, 1, 1, 1, 0);
    struct tt freqs = tt_new(BERTH_DTYPE_F32, n_pairs ? n_pairs : 1, 1, 1, 1, 0);
    trand(&k.t, -2, 2);
    trand(&v.t, -2, 2);
    trand(&q.t, -2, 2);
    memcpy(ref.host, q.host, q.bytes);
    trand(&kn.t, -0.5, 0.5);
    trand(&qn.t, 0.5, 1.5);
    trand(&freqs.t, 0.001, 1);
    int32_t slotv[5] = {3, 9, -1, 17, 22}, posv[5];
    for (int t = 0; t < T; t++)
        posv[t] = irand(0, 3000);
    struct tt slots = ivec(slotv, T), pos = ivec(posv, T);
    const float eps = 1e-6f;
    berth_kv_append_params p = {
        .struct_size = sizeof p, .k_norm_mode = BERTH_NORM_W, .v_norm_mode = BERTH_NORM_UNIT, .eps = eps,
        .rope_mode = rope_mode, .rope_pair_offset = pair_offset, .rope_n_pairs = n_pairs, .k = k.t, .v = v.t,
        .slots = slots.t, .k_norm = kn.t, .v_norm = absent, .positions = n_pairs ? pos.t : absent,
        .rope_freqs = n_pairs ? freqs.t : absent, .kv = pl2.kv};
    CHECK(ops->kv_append(be, st, &p) == BERTH_OK, "%s", g_last_error); /* without q: the K/V reference */
    p.kv = pl.kv;
    p.q = q.t;
    p.q_norm_mode = qmode;
    p.q_norm = has_weight(qmode) ? qn.t : absent;
    ck_assert_int_eq(vt->supports(be, BERTH_OP_KV_APPEND, &p), BERTH_OK);
    CHECK(ops->kv_append(be, st, &p) == BERTH_OK, "%s", g_last_error);
    ck_assert_msg(memcmp(pl.mem.host, pl2.mem.host, pl.mem.bytes) == 0, "the pool differs with the query side");
    berth_rms_norm_params rp = {.struct_size = sizeof rp, .weight_mode = qmode, .resid_mode = BERTH_RESID_NONE,
                                .eps = eps, .x = ref.t, .w = has_weight(qmode) ? qn.t : absent, .y = ref.t};
    if (n_pairs) {
        rp.rope_mode = rope_mode;
        rp.rope_pair_offset = pair_offset;
        rp.rope_n_pairs = n_pairs;
        rp.rope_positions = pos.t;
        rp.rope_freqs = freqs.t;
    }
    if (qmode == BERTH_NORM_W_NONE) /* rms_norm has no "no norm" mode: the rope op is the reference then */
        ck_assert_msg(n_pairs > 0, "case needs RoPE");
    if (qmode != BERTH_NORM_W_NONE) {
        CHECK(ops->rms_norm(be, st, &rp) == BERTH_OK, "%s", g_last_error);
    } else {
        berth_rope_params ro = {.struct_size = sizeof ro, .mode = rope_mode, .pair_offset = pair_offset,
                                .n_pairs = n_pairs, .x = ref.t, .y = ref.t, .positions = pos.t, .freqs = freqs.t};
        CHECK(ops->rope(be, st, &ro) == BERTH_OK, "%s", g_last_error);
    }
    ck_assert_msg(memcmp(q.host, ref.host, q.bytes) == 0, "q after kv_append differs from rms_norm + RoPE");

    berth_kv_append_params bad = p;
    bad.q.ne[2] = T - 1;
    expect_error(ops->kv_append(be, st, &bad), BERTH_E_INVALID,
                 "kv_append: q must be ne {head_dim 32, n_q_heads, T 5}, got {32, 6, 4, 1}");
    bad = p;
    bad.q_norm_mode = BERTH_NORM_W;
    bad.q_norm = absent;
    expect_error(ops->kv_append(be, st, &bad), BERTH_E_INVALID,
                 "kv_append: q_norm_mode 1 needs the q_norm weight, which is absent");
    /* a caller built before ABI 0.5 (struct_size stops at kv): whatever lies past it is never read — here a q that
     * would fail every check — and the op is K/V only */
    memcpy(ref.host, q.host, q.bytes);
    bad = p;
    bad.struct_size = (uint32_t)BERTH_SIZE_TO(berth_kv_append_params, kv);
    bad.q = k.t;
    bad.q_norm_mode = 9;
    CHECK(ops->kv_append(be, st, &bad) == BERTH_OK, "%s", g_last_error);
    ck_assert_msg(memcmp(q.host, ref.host, q.bytes) == 0, "a pre-0.5 caller's kv_append touched q");
    bad = p;
    bad.q = k.t; /* written in place while K is read */
    expect_error(ops->kv_append(be, st, &bad), BERTH_E_INVALID, "kv_append: q shares elements with k or v");
    bad = p;
    bad.q_norm_mode = 9;
    expect_error(ops->kv_append(be, st, &bad), BERTH_E_UNSUPPORTED, "kv_append: q_norm_mode 9 is not supported");
    tt_free(&pl.mem);
    tt_free(&pl2.mem);
    tt_free(&k);
    tt_free(&v);
    tt_free(&q);
    tt_free(&ref);
    tt_free(&kn);
    tt_free(&qn);
    tt_free(&freqs);
    tt_free(&slots);
    tt_free(&pos);
}

START_TEST(test_kv_append_query_side)
{
    kv_append_q_case(BERTH_NORM_W, BERTH_ROPE_HALF, 8, 16);          /* Gemma 4 */
    kv_append_q_case(BERTH_NORM_W_ONE_PLUS, BERTH_ROPE_INTERLEAVED, 16, 0);
    kv_append_q_case(BERTH_NORM_UNIT, BERTH_ROPE_HALF, 0, 0);        /* a norm, no rotation */
    kv_append_q_case(BERTH_NORM_W_NONE, BERTH_ROPE_HALF, 4, 16);     /* a rotation, no norm */
}
END_TEST

START_TEST(test_kv_append)
{
    for (int d = 0; d < 3; d++) {
        kv_append_case(wdts[d], BERTH_NORM_W_NONE, BERTH_NORM_W_NONE, BERTH_ROPE_HALF, 0, 0); /* plain scatter */
        kv_append_case(wdts[d], BERTH_NORM_W, BERTH_NORM_W_ONE_PLUS, BERTH_ROPE_HALF, 4, 16);  /* Gemma full, mini */
        kv_append_case(wdts[d], BERTH_NORM_W_ONE_PLUS, BERTH_NORM_W_NONE, BERTH_ROPE_INTERLEAVED, 16, 0);
        kv_append_case(wdts[d], BERTH_NORM_W_NONE, BERTH_NORM_W, BERTH_ROPE_HALF, 16, 16);
        kv_append_case(wdts[d], BERTH_NORM_W, BERTH_NORM_UNIT, BERTH_ROPE_HALF, 8, 16);   /* Gemma 4: weightless V */
        kv_append_case(wdts[d], BERTH_NORM_UNIT, BERTH_NORM_UNIT, BERTH_ROPE_INTERLEAVED, 0, 0);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------------------------------
 * attention */

struct attn_seq {
    int32_t q_len, kv_len;
};

static void attention_case(berth_dtype kdt, int32_t hd, int32_t hdv, int32_t H, int32_t HKV, int mask, int32_t window,
                           float softcap, int use_gate, const struct attn_seq *seqs, int32_t n_seqs)
{
    const int32_t BS = 4, NB = 24;
    struct pool pl = pool_new(kdt, NB, BS, HKV, hd, hdv);
    int32_t T = 0, max_blocks = 1;
    for (int i = 0; i < n_seqs; i++) {
        T += seqs[i].q_len;
        const int32_t nb = (seqs[i].kv_len + BS - 1) / BS;
        max_blocks = nb + 1 > max_blocks ? nb + 1 : max_blocks;
    }
    struct tt q = tt_new(BERTH_DTYPE_F32, hd, H, T, 1, 1);
    struct tt out = tt_new(BERTH_DTYPE_F32, hdv, H, T, 1, 2);
    struct tt gate = tt_new(BERTH_DTYPE_F32, hdv, H, T, 1, 0);
    struct tt bt = tt_new(BERTH_DTYPE_I32, max_blocks, n_seqs, 1, 1, 1);
    trand(&q.t, -1, 1);
    trand(&gate.t, -3, 3);
    int32_t qs[16], kl[16], posv[64], row_seq[64], perm[24];
    for (int i = 0; i < NB; i++)
        perm[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        const int j = irand(0, i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t used = 0, t0 = 0;
    for (int i = 0; i < n_seqs; i++) {
        qs[i] = t0;
        kl[i] = seqs[i].kv_len;
        int32_t min_lo = INT32_MAX;
        for (int32_t r = 0; r < seqs[i].q_len; r++) {
            /* prefill chunk ends at the newest key; encoder rows get arbitrary positions */
            posv[t0 + r] = mask == BERTH_MASK_CAUSAL ? seqs[i].kv_len - seqs[i].q_len + r : irand(0, 100);
            row_seq[t0 + r] = i;
            const int32_t lo = window > 0 ? posv[t0 + r] - window + 1 : 0;
            min_lo = lo < min_lo ? lo : min_lo;
        }
        for (int32_t b = 0; b < max_blocks; b++) {
            int32_t e = -7; /* beyond the sequence */
            if (b * BS < seqs[i].kv_len)
                e = (b + 1) * BS <= min_lo ? -1 : perm[used++]; /* blocks no query sees may be negative */
            tset(&bt.t, b, i, 0, 0, e);
        }
        t0 += seqs[i].q_len;
    }
    qs[n_seqs] = T;
    struct tt pos = ivec(posv, T), sqs = ivec(qs, n_seqs + 1), skl = ivec(kl, n_seqs);
    tpoison(&out.t);
    tsnap(&out);
    const float scale = (float)urand(0.5, 1.5) / sqrtf((float)hd);
    berth_attention_params p = {.struct_size = sizeof p, .mask = mask, .window = window, .scale = scale,
                                .softcap = softcap, .n_seqs = n_seqs, .max_q_len = T, .max_kv_len = 64,
                                .q = q.t, .out = out.t, .gate = use_gate ? gate.t : absent, .positions = pos.t,
                                .seq_q_start = sqs.t, .seq_kv_len = skl.t, .block_table = bt.t, .kv = pl.kv};
    ck_assert_int_eq(vt->supports(be, BERTH_OP_ATTENTION, &p), BERTH_OK);
    CHECK(ops->attention(be, st, &p) == BERTH_OK, "%s", g_last_error);
    char what[128];
    snprintf(what, sizeof what, "attention %s hd%d/%d H%d/%d mask%d win%d cap%g gate%d", dtn(kdt), hd, hdv, H, HKV, mask,
             window, (double)softcap, use_gate);
    const int32_t rep = H / HKV;
    double *sc = malloc(sizeof(double) * 64), *o = malloc(sizeof(double) * (size_t)hdv);
    for (int32_t t = 0; t < T; t++) {
        const int32_t i = row_seq[t];
        int32_t lo = 0, hi = kl[i];
        if (mask == BERTH_MASK_CAUSAL) {
            hi = posv[t] + 1 < kl[i] ? posv[t] + 1 : kl[i];
            lo = window > 0 && posv[t] - window + 1 > 0 ? posv[t] - window + 1 : 0;
        }
        for (int32_t h = 0; h < H; h++) {
            const int32_t g = h / rep;
            double mx = -INFINITY, sum = 0;
            for (int32_t s = lo; s < hi; s++) {
                const int32_t blk = (int32_t)tget(&bt.t, s / BS, i, 0, 0);
                double d = 0;
                for (int32_t e = 0; e < hd; e++)
                    d += tget(&q.t, e, h, t, 0) * kv_get(&pl, 0, blk, s % BS, g, e);
                d *= scale;
                if (softcap > 0)
                    d = softcap * tanh(d / softcap);
                sc[s - lo] = d;
                mx = d > mx ? d : mx;
            }
            for (int32_t s = lo; s < hi; s++)
                sum += (sc[s - lo] = exp(sc[s - lo] - mx));
            for (int32_t e = 0; e < hdv; e++)
                o[e] = 0;
            for (int32_t s = lo; s < hi; s++) {
                const int32_t blk = (int32_t)tget(&bt.t, s / BS, i, 0, 0);
                for (int32_t e = 0; e < hdv; e++)
                    o[e] += sc[s - lo] / sum * kv_get(&pl, 1, blk, s % BS, g, e);
            }
            for (int32_t e = 0; e < hdv; e++) {
                double ref = o[e];
                if (use_gate)
                    ref *= 1 / (1 + exp(-tget(&gate.t, e, h, t, 0)));
                check_close(tget(&out.t, e, h, t, 0), ref, 1, 1e-5, what, e, h, t, 0);
            }
        }
    }
    tcheck_outside(&out, &out.t, what);
    free(sc);
    free(o);
    tt_free(&pl.mem);
    tt_free(&q);
    tt_free(&out);
    tt_free(&gate);
    tt_free(&bt);
    tt_free(&pos);
    tt_free(&sqs);
    tt_free(&skl);
}

START_TEST(test_attention)
{
    const struct attn_seq mixed[] = {{5, 9}, {1, 6}, {1, 1}}; /* a prefill chunk and two decode rows */
    attention_case(BERTH_DTYPE_F32, 16, 16, 4, 2, BERTH_MASK_CAUSAL, 0, 0, 0, mixed, 3);
    attention_case(BERTH_DTYPE_BF16, 32, 32, 4, 1, BERTH_MASK_CAUSAL, 3, 5.0f, 1, mixed, 3); /* window bites */
    const struct attn_seq long_ctx[] = {{3, 3}, {2, 21}};
    attention_case(BERTH_DTYPE_F16, 256, 256, 2, 2, BERTH_MASK_CAUSAL, 50, 0, 0, long_ctx, 2); /* window does not */
    attention_case(BERTH_DTYPE_F32, 256, 256, 4, 2, BERTH_MASK_CAUSAL, 5, 0, 1, long_ctx, 2);  /* negative blocks */
    const struct attn_seq full[] = {{4, 7}, {1, 13}};
    attention_case(BERTH_DTYPE_F32, 512, 512, 4, 2, BERTH_MASK_CAUSAL, 0, 0, 0, full, 2); /* Gemma 4 full layer */
    attention_case(BERTH_DTYPE_BF16, 512, 512, 2, 1, BERTH_MASK_CAUSAL, 0, 30.0f, 0, full, 2);
    const struct attn_seq enc[] = {{4, 6}, {2, 5}};
    attention_case(BERTH_DTYPE_F32, 32, 16, 3, 3, BERTH_MASK_NONE, 0, 0, 0, enc, 2); /* encoder; head_dim_v differs */
    const struct attn_seq gqa8[] = {{3, 11}};
    attention_case(BERTH_DTYPE_F16, 16, 16, 8, 1, BERTH_MASK_CAUSAL, 0, 0, 1, gqa8, 1);
    const struct attn_seq empty[] = {{1, 0}, {2, 2}}; /* a row with no key at all: zeros */
    attention_case(BERTH_DTYPE_F32, 16, 16, 2, 1, BERTH_MASK_CAUSAL, 0, 0, 0, empty, 2);
}
END_TEST

START_TEST(test_attention_bad_metadata)
{
    struct pool pl = pool_new(BERTH_DTYPE_F32, 4, 4, 1, 16, 16);
    struct tt q = tt_new(BERTH_DTYPE_F32, 16, 1, 2, 1, 0), out = tt_new(BERTH_DTYPE_F32, 16, 1, 2, 1, 0);
    const int32_t posv[2] = {4, 5}, qsv[2] = {0, 2}, klv[1] = {6}, btv[3] = {1, 9, 0};
    struct tt pos = ivec(posv, 2), sqs = ivec(qsv, 2), skl = ivec(klv, 1), bt = ivec(btv, 3);
    trand(&q.t, -1, 1);
    berth_attention_params p = {.struct_size = sizeof p, .mask = BERTH_MASK_CAUSAL, .scale = 0.25f, .n_seqs = 1,
                                .q = q.t, .out = out.t, .positions = pos.t, .seq_q_start = sqs.t,
                                .seq_kv_len = skl.t, .block_table = bt.t, .kv = pl.kv};
    p.block_table.ne[0] = 3;
    p.block_table.ne[1] = 1;
    expect_error(ops->attention(be, st, &p), BERTH_E_INVALID,
                 "attention: block_table[seq 0][1] = 9 is not a block of the pool (0..3)");
    tset(&skl.t, 0, 0, 0, 0, 13);
    expect_error(ops->attention(be, st, &p), BERTH_E_INVALID, "attention: seq_kv_len[0] = 13 does not fit 3 blocks of 4");
    tset(&skl.t, 0, 0, 0, 0, 6);
    tset(&sqs.t, 1, 0, 0, 0, 1);
    expect_error(ops->attention(be, st, &p), BERTH_E_INVALID, "attention: seq_q_start must rise from 0 to T = 2 (seq 0: [0, 1))");
    tt_free(&pl.mem);
    tt_free(&q);
    tt_free(&out);
    tt_free(&pos);
    tt_free(&sqs);
    tt_free(&skl);
    tt_free(&bt);
}
END_TEST

static void add_tests(TCase *tc)
{
    tcase_add_test(tc, test_kv_append);
    tcase_add_test(tc, test_kv_append_query_side);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_attention_bad_metadata);
}

int main(void)
{
    return cpu_test_run("cpu_attention", add_tests);
}

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
 *
 * Run with HX_COMPUTE=bf16 (test cuda_ops_attention_bf16), prefill/mixed cases over a bf16/f16 cache take the
 * tensor-core kernel and are held to a bound derived from its bf16/f16 rounding (see "BF16 compute mode" below);
 * the "tc:" cases are its shapes (head dims 256 and 512, windows that bite and not, several sequences, chunks past
 * position 0). Every other case keeps the fp32 tolerance in both modes.
 *
 * Decode batches (T == n_seqs, one row per sequence) take attention_decode.cu's one-launch cluster kernel;
 * BERTH_CUDA_ATT_DECODE=old (attention.cu's split-K kernel and combine) and =c8 (clusters of at most 8 blocks)
 * rerun the same cases on the other paths. With HX_COMPUTE=bf16 and BERTH_CUDA_ATT_DECODE=mma (test
 * cuda_ops_attention_bf16_mma, which also sets HX_ATT_DECODE_MMA=1 to tell this file) decode cases over an
 * aligned bf16/f16 cache with up to 8 query heads per KV head take attention_decode_mma.cu's tensor-core kernel
 * and are held to the same bound as the prefill kernel's (same rounding contract). The "cluster:" cases are that
 * kernel's edges: split boundaries, length 1, length == window, rows
 * without a cluster, block tables wider than the part it preloads, and (graphs) replays with 0 visible keys. The
 * "onepass:" cases give the tensor-core kernel's one-pass instance 2 to 7 splits.
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

/* ---- BF16 compute mode: the tensor-core prefill kernel and its error bound ----------------------------------
 *
 * With HX_COMPUTE=bf16 the CUDA backend runs a prefill or mixed batch over a bf16 (f16) cache on the tensor cores
 * when the head dims are multiples of 16 and K/V rows are 16-byte aligned (tensor_core_expected mirrors that rule,
 * attention.cu: att_mma_ok). That kernel rounds q and P = e^(s - m) to bf16 (f16); K and V are used as stored and
 * everything else is fp32. The CPU backend rounds neither, so these cases are held to a host reference in double
 * precision that rounds q exactly as the kernel does (to nearest even), which leaves P's rounding and fp32:
 *   - each weight p_j becomes p_j (1 + d_j) with |d_j| <= u (u = 2^-8 for bf16, 2^-11 for f16), and the kernel's
 *     row sum adds the same rounded values, so out = sum_j p_j (1 + d_j) v_j / sum_j p_j (1 + d_j) and
 *         |out_d - ref_d| <= u / (1 - u) * sum_j p_j |v_jd - ref_d|     (the weighted spread of V about ref);
 *   - f16 only: a weight below 2^-14 (f16's smallest normal, relative to the running max) is rounded with an
 *     absolute error up to 2^-25, adding 2^-25 * sum_j |v_jd - ref_d| (the row sum is >= 1: it holds e^0);
 *   - fp32 arithmetic (accumulation order, exp2): the fp32 tolerance of the other cases, atol = rtol = tol;
 * all times sigmoid(gate) when gated. This is a worst case, but a nearly tight one: with Gemma's scale 1 the
 * softmax is peaked, one or two keys carry the spread and their roundings do not average out (a C emulation of
 * the kernel's arithmetic used up to 75% of it over six seeds; each case prints the fraction it used). A missing,
 * extra or wrong key of weight p moves out_d by about p |v_jd - ref_d|, over the bound once p exceeds about u
 * times the row's weighted spread. The same reference with q unrounded is checked against the CPU backend at the
 * fp32 tolerance (so it cannot drift from the backend's semantics), and for bf16 the GPU must differ from the CPU
 * by more than fp32 noise somewhere (the tensor-core path really ran). */

static int compute_bf16(void)
{
    const char *m = getenv("HX_COMPUTE");
    return m && strcmp(m, "bf16") == 0;
}

static int tensor_core_expected(const struct attn_case *c, const struct pool *p, int T)
{
    const berth_kv_view *kv = &p->kv;
    const uint64_t align = p->v_off | kv->block_stride | kv->token_stride | kv->head_stride | kv->v_token_stride |
                           kv->v_head_stride;
    const char *dm = getenv("HX_ATT_DECODE_MMA");
    const int decode_mma = dm && strcmp(dm, "1") == 0 && c->n_rep <= 8 && c->D <= 512 && c->DV <= 512;
    int max_q = 0; /* the backend's decode kernels serve T == n_seqs with one row per sequence (max_q_len 1) */
    for (int i = 0; i < c->n_seqs; i++)
        max_q = c->seqs[i].q_len > max_q ? c->seqs[i].q_len : max_q;
    const int decode = T == c->n_seqs && max_q <= 1;
    return compute_bf16() && (!decode || decode_mma) &&
           (c->kv_dt == BERTH_DTYPE_BF16 || c->kv_dt == BERTH_DTYPE_F16) && c->D % 16 == 0 && c->DV % 16 == 0 &&
           align % 16 == 0;
}

static float round_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* nearest even; inputs here are finite */
    memcpy(&f, &u, 4);
    return f;
}

static double kv_elem(const unsigned char *pool, berth_dtype dt, uint64_t off)
{
    uint16_t u;
    if (dt == BERTH_DTYPE_F32) {
        float f;
        memcpy(&f, pool + off, 4);
        return f;
    }
    memcpy(&u, pool + off, 2);
    if (dt == BERTH_DTYPE_F16) {
        _Float16 h;
        memcpy(&h, &u, 2);
        return (double)h;
    }
    const uint32_t w = (uint32_t)u << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
}

/* What the reference needs besides the case: the inputs both backends saw, on the host. */
struct ref_inputs {
    const unsigned char *pool; /* the pool's bytes */
    const int32_t *bt, *qpos, *qstart, *kvlen;
    int bt_w, T;
    const float *q;    /* [T][H][D + qmis] */
    const float *gate; /* [T][H][DV] */
};

/* out[t][h][d] in double with q rounded to qdt (F32: not rounded); spread_w = sum_j p_j |v_jd - out_d| and
 * spread = sum_j |v_jd - out_d| (both before the gate), gsig = the gate's sigmoid (1 without a gate). Rows that
 * see no key: all zero. */
static void host_attention(const struct attn_case *c, const struct pool *p, const struct ref_inputs *in,
                           berth_dtype qdt, double *out, double *spread_w, double *spread, double *gsig)
{
    const int H = c->n_kvh * c->n_rep, D = c->D, DV = c->DV, qmis = c->layout == 2;
    const berth_kv_view *kv = &p->kv;
    const uint64_t es = c->kv_dt == BERTH_DTYPE_F32 ? 4 : 2;
    const size_t max_kv = (size_t)in->bt_w * (size_t)c->bs;
    /* one sequence's K and V of one KV head, widened; ok[j]: key j's block is a block of the pool */
    double *kd = malloc(sizeof(double) * max_kv * (size_t)D), *vd = malloc(sizeof(double) * max_kv * (size_t)DV);
    double *w = malloc(sizeof(double) * max_kv), *qv = malloc(sizeof(double) * (size_t)D);
    double *acc = malloc(sizeof(double) * (size_t)DV), *sw = malloc(sizeof(double) * (size_t)DV);
    double *sa = malloc(sizeof(double) * (size_t)DV);
    char *ok = malloc(max_kv);
    ck_assert(kd && vd && w && qv && acc && sw && sa && ok);
    for (int s = 0; s < c->n_seqs; s++) {
        const int kvl = in->kvlen[s];
        for (int g = 0; g < c->n_kvh; g++) {
            for (int j = 0; j < kvl; j++) {
                const int32_t b = in->bt[s * in->bt_w + j / c->bs];
                ok[j] = b >= 0 && b < kv->n_blocks;
                if (!ok[j])
                    continue;
                const uint64_t slot = (uint64_t)(j % c->bs);
                const uint64_t k0 = (uint64_t)b * kv->block_stride + slot * kv->token_stride +
                                    (uint64_t)g * kv->head_stride;
                const uint64_t v0 = p->v_off + (uint64_t)b * kv->block_stride + slot * kv->v_token_stride +
                                    (uint64_t)g * kv->v_head_stride;
                for (int d = 0; d < D; d++)
                    kd[(size_t)j * D + d] = kv_elem(in->pool, c->kv_dt, k0 + (uint64_t)d * es);
                for (int d = 0; d < DV; d++)
                    vd[(size_t)j * DV + d] = kv_elem(in->pool, c->kv_dt, v0 + (uint64_t)d * es);
            }
            for (int t = in->qstart[s]; t < in->qstart[s + 1]; t++) {
                const int pos = in->qpos[t];
                int lo = 0, hi = kvl;
                if (c->mask == BERTH_MASK_CAUSAL) {
                    hi = pos + 1 < kvl ? pos + 1 : kvl;
                    lo = c->window > 0 && pos - c->window + 1 > 0 ? pos - c->window + 1 : 0;
                }
                for (int r = 0; r < c->n_rep; r++) {
                    const int h = g * c->n_rep + r;
                    const size_t o0 = ((size_t)t * H + h) * (size_t)DV;
                    const float *qr = in->q + ((size_t)t * H + h) * (size_t)(D + qmis) + qmis;
                    for (int d = 0; d < D; d++)
                        qv[d] = qdt == BERTH_DTYPE_BF16 ? (double)round_bf16(qr[d])
                                : qdt == BERTH_DTYPE_F16 ? (double)(_Float16)qr[d] : (double)qr[d];
                    double mx = -INFINITY, sum = 0.0;
                    for (int j = lo; j < hi; j++) {
                        ck_assert_msg(ok[j], "%s: reference: visible key %d of seq %d has no block", c->name, j, s);
                        double dot = 0.0;
                        for (int d = 0; d < D; d++)
                            dot += qv[d] * kd[(size_t)j * D + d];
                        double sc = (double)c->scale * dot;
                        if (c->softcap > 0.0f)
                            sc = c->softcap * tanh(sc / c->softcap);
                        w[j] = sc;
                        mx = sc > mx ? sc : mx;
                    }
                    for (int j = lo; j < hi; j++)
                        sum += (w[j] = exp(w[j] - mx));
                    for (int d = 0; d < DV; d++)
                        acc[d] = sw[d] = sa[d] = 0.0;
                    for (int j = lo; j < hi; j++)
                        for (int d = 0; d < DV; d++)
                            acc[d] += w[j] * vd[(size_t)j * DV + d];
                    for (int d = 0; d < DV; d++)
                        acc[d] = hi > lo ? acc[d] / sum : 0.0;
                    for (int j = lo; j < hi; j++)
                        for (int d = 0; d < DV; d++) {
                            const double dv = fabs(vd[(size_t)j * DV + d] - acc[d]);
                            sw[d] += w[j] * dv;
                            sa[d] += dv;
                        }
                    for (int d = 0; d < DV; d++) {
                        const double gs = c->gate ? 1.0 / (1.0 + exp(-(double)in->gate[o0 + d])) : 1.0;
                        out[o0 + d] = acc[d] * gs;
                        spread_w[o0 + d] = hi > lo ? sw[d] / sum : 0.0;
                        spread[o0 + d] = sa[d];
                        gsig[o0 + d] = gs;
                    }
                }
            }
        }
    }
    free(kd);
    free(vd);
    free(w);
    free(qv);
    free(acc);
    free(sw);
    free(sa);
    free(ok);
}

/* The checks described above for a case that ran on the tensor cores. tol: the fp32 tolerance. */
static void expect_tensor_core_bound(const struct attn_case *c, const struct pool *p, const struct ref_inputs *in,
                                     const struct hx_tensor *out, double tol, const char *what)
{
    const size_t n = (size_t)in->T * (size_t)(c->n_kvh * c->n_rep) * (size_t)c->DV;
    const int f16 = c->kv_dt == BERTH_DTYPE_F16;
    const double u = f16 ? 0x1p-11 : 0x1p-8, uabs = f16 ? 0x1p-25 : 0.0;
    double *ref = malloc(sizeof(double) * n), *sw = malloc(sizeof(double) * n), *sa = malloc(sizeof(double) * n);
    double *gs = malloc(sizeof(double) * n);
    float *gpu = malloc(sizeof(float) * n), *cpu = malloc(sizeof(float) * n);
    ck_assert(ref && sw && sa && gs && gpu && cpu);
    hx_get_f32(out, HX_GPU, gpu);
    hx_get_f32(out, HX_CPU, cpu);

    /* The reference with q as given equals the CPU backend (fp32 tolerance). */
    host_attention(c, p, in, BERTH_DTYPE_F32, ref, sw, sa, gs);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(isfinite(cpu[i]) && fabs(cpu[i] - ref[i]) <= tol + tol * fabs(ref[i]),
                      "%s: host reference vs CPU backend at %zu: cpu %.9g ref %.9g (seed %llu)", what, i,
                      (double)cpu[i], ref[i], (unsigned long long)hx->seed);

    /* How far rounding q alone moves the reference: the proof below needs it to show. */
    double *ref_u = malloc(sizeof(double) * n);
    ck_assert(ref_u);
    memcpy(ref_u, ref, sizeof(double) * n);

    /* The GPU within the bound of the reference with q rounded like the kernel. */
    host_attention(c, p, in, c->kv_dt, ref, sw, sa, gs);
    double q_shift = 0.0;
    for (size_t i = 0; i < n; i++)
        q_shift = fmax(q_shift, fabs(ref[i] - ref_u[i]));
    free(ref_u);
    double worst_frac = 0.0, worst_err = 0.0, max_vs_cpu = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)gpu[i] - ref[i]);
        const double bound = gs[i] * (u / (1.0 - u) * sw[i] + uabs * sa[i]) + tol + tol * fabs(ref[i]);
        ck_assert_msg(isfinite(gpu[i]) && err <= bound,
                      "%s: element %zu of %zu: gpu %.9g, reference (q rounded) %.9g, |diff| %.3g > bound %.3g "
                      "(P rounding %.3g + fp32 %.3g; seed %llu)",
                      what, i, n, (double)gpu[i], ref[i], err, bound, bound - tol - tol * fabs(ref[i]),
                      tol + tol * fabs(ref[i]), (unsigned long long)hx->seed);
        worst_frac = err / bound > worst_frac ? err / bound : worst_frac;
        worst_err = err > worst_err ? err : worst_err;
        const double dc = fabs((double)gpu[i] - (double)cpu[i]);
        max_vs_cpu = dc > max_vs_cpu ? dc : max_vs_cpu;
    }
    /* Proof that the rounding path ran, where rounding shows: bf16, and rounding q alone moves the reference by
     * 16 fp32 tolerances somewhere (then the GPU, off that reference by P's rounding at most, must be off the
     * unrounded CPU by 4). Not always so: with Gemma's scale 1 at head dim 512 the softmax of unit-RMS q and k is
     * often so peaked that one key takes P = 1 on either path (one such case equalled the CPU within 5.9e-5). */
    if (!f16 && q_shift > 16.0 * tol)
        ck_assert_msg(max_vs_cpu > 4.0 * tol, "%s: the GPU equals the CPU within %.3g although rounding q moves the "
                      "reference by %.3g: the tensor-core path (bf16 q and P) did not run", what, max_vs_cpu, q_shift);
    printf("%s: tensor cores: largest |gpu - ref| %.3g, %.1f%% of its bound; largest |gpu - cpu| %.3g (rounding q "
           "moves the reference by %.3g)\n", what, worst_err, 100.0 * worst_frac, max_vs_cpu, q_shift);
    fflush(stdout);
    free(ref);
    free(sw);
    free(sa);
    free(gs);
    free(gpu);
    free(cpu);
}

/* kv_append's params for one side: c's norms (eps 1e-6) and RoPE; K and V are views into kvin, a fused projection
 * output {n_kvh * (D + DV), T} (per token: K of every KV head, then V). pos, knw, vnw and freqs are read only when
 * c uses RoPE / weighted norms (NULL otherwise). */
static berth_kv_append_params append_params(const struct attn_case *c, const struct pool *pool, int side,
                                            const struct hx_tensor *kvin, const struct hx_tensor *slots,
                                            const struct hx_tensor *pos, const struct hx_tensor *knw,
                                            const struct hx_tensor *vnw, const struct hx_tensor *freqs)
{
    const int64_t T = kvin->ne[1], in_row = (int64_t)c->n_kvh * (c->D + c->DV) * 4;
    berth_kv_append_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.k_norm_mode = c->k_norm;
    p.v_norm_mode = c->v_norm;
    p.eps = 1e-6f;
    p.rope_mode = c->rope_mode;
    p.rope_pair_offset = c->rope_off;
    p.rope_n_pairs = c->rope_pairs;
    p.k = view3(kvin, side, 0, c->D, c->n_kvh, T, (int64_t)c->D * 4, in_row);
    p.v = view3(kvin, side, (uint64_t)c->n_kvh * c->D * 4, c->DV, c->n_kvh, T, (int64_t)c->DV * 4, in_row);
    p.slots = slots->t[side];
    if (c->k_norm == BERTH_NORM_W || c->k_norm == BERTH_NORM_W_ONE_PLUS)
        p.k_norm = knw->t[side];
    if (c->v_norm == BERTH_NORM_W || c->v_norm == BERTH_NORM_W_ONE_PLUS)
        p.v_norm = vnw->t[side];
    if (c->rope_pairs > 0) {
        p.positions = pos->t[side];
        p.rope_freqs = freqs->t[side];
    }
    p.kv = pool_view(pool, side);
    return p;
}

/* The fp32 tolerance of an attention output (atol = rtol). Both sides accumulate fp32 dot products in different
 * orders; the score error grows with the score's size, about scale * sqrt(D) for unit-RMS q and k (Gemma: scale 1,
 * D 512 -> ~1e-5 seen in outputs), and reaches the output through e^score. A wrong key, weight or mask costs 1e-3
 * or more. */
static double att_tol(float scale, int D)
{
    return 2e-5 * fmax(1.0, scale * sqrt((double)D) / 4.0);
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
    for (int side = 0; side < 2; side++) {
        const berth_kv_append_params p = append_params(c, &pool, side, &kvin, &tslots, &tapos, &knw, &vnw, &freqs);
        const berth_status st = hx_op(side, BERTH_OP_KV_APPEND, &p);
        ck_assert_msg(st == BERTH_OK, "%s: kv_append on %s: status %d: %s", c->name, side ? "cuda" : "cpu", st,
                      hx_last_error);
    }
    hx_sync();
    char what[640];
    snprintf(what, sizeof what, "%s: KV pool after kv_append", c->name);
    hx_expect_close(&pool.mem, 1e-5, pool_rtol(c->kv_dt), what);
    /* Again with the query side (ABI 0.5): the same K/V into the same slots (the pool must not change) and H query
     * heads and one more per token (a count that need not be a multiple of the KV heads: the last group of query
     * blocks is partly idle), normalised with K's norm mode (their own weight) and rotated in place, each row a view
     * with a gap after it; the slot -1 token's query is processed too. */
    {
        const int HQ = H + 1;
        struct hx_tensor qin = hx_new(BERTH_DTYPE_F32, c->D + 4, HQ, T_app, 0);
        struct hx_tensor qnw = hx_new(c->norm_dt, c->D, 0, 0, 0);
        hx_rand(&qin, -1.0f, 1.0f);
        hx_rand(&qnw, c->k_norm == BERTH_NORM_W_ONE_PLUS ? -0.5f : 0.5f,
                c->k_norm == BERTH_NORM_W_ONE_PLUS ? 0.5f : 1.5f);
        for (int side = 0; side < 2; side++) {
            berth_kv_append_params p = append_params(c, &pool, side, &kvin, &tslots, &tapos, &knw, &vnw, &freqs);
            p.q = view3(&qin, side, 0, c->D, HQ, T_app, (int64_t)(c->D + 4) * 4, (int64_t)(c->D + 4) * 4 * HQ);
            p.q_norm_mode = c->k_norm;
            if (c->k_norm == BERTH_NORM_W || c->k_norm == BERTH_NORM_W_ONE_PLUS)
                p.q_norm = qnw.t[side];
            const berth_status st = hx_op(side, BERTH_OP_KV_APPEND, &p);
            ck_assert_msg(st == BERTH_OK, "%s: kv_append with q on %s: status %d: %s", c->name,
                          side ? "cuda" : "cpu", st, hx_last_error);
        }
        hx_sync();
        snprintf(what, sizeof what, "%s: KV pool after kv_append with q", c->name);
        hx_expect_close(&pool.mem, 1e-5, pool_rtol(c->kv_dt), what);
        snprintf(what, sizeof what, "%s: q after kv_append with q", c->name);
        hx_expect_close(&qin, 1e-5, 1e-5, what);
        hx_free(&qin);
        hx_free(&qnw);
    }

    /* Both backends attend over the CPU's pool (kept here for the tensor-core bound's reference). */
    unsigned char *pool_bytes = malloc(pool.mem.bytes);
    ck_assert(pool_bytes);
    hx_get(&pool.mem, HX_CPU, pool_bytes);
    hx_set(&pool.mem, pool_bytes);

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
    const double tol = att_tol(c->scale, c->D);
    snprintf(what, sizeof what, "%s: attention output", c->name);
    if (tensor_core_expected(c, &pool, T)) {
        float *qh = malloc(q.bytes), *gh = malloc(gate.bytes);
        ck_assert(qh && gh);
        hx_get_f32(&q, HX_CPU, qh);
        hx_get_f32(&gate, HX_CPU, gh);
        const struct ref_inputs in = {pool_bytes, bt, qpos, qstart, kvlen, bt_w, T, qh, gh};
        expect_tensor_core_bound(c, &pool, &in, &out, tol, what);
        free(qh);
        free(gh);
    } else {
        hx_expect_close(&out, tol, tol, what);
    }

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
    free(pool_bytes);
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
    {"decode-shaped (T == n_seqs): a sequence of 2 rows, one of none, one of 1, window 20",
     BF16, 256, 256, 1, 8, 16, 0, 3, {{2, 50}, {0, 10}, {1, 30}},
     CAUSAL, 20, 1.0f, 0.0f, 1, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 0},
    {"decode-shaped, long rows (splits): a sequence of 2 rows, one of none, one of 1",
     BF16, 256, 256, 1, 8, 16, 0, 3, {{2, 900}, {0, 10}, {1, 800}},
     CAUSAL, 0, 1.0f, 0.0f, 1, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 0},
    /* prefill / mixed shapes of the tensor-core kernel (HX_COMPUTE=bf16; the SIMT kernel's in fp32 mode) */
    {"tc: prefill d256 bf16 rep8 window 512 (does not bite), 200 rows",
     BF16, 256, 256, 1, 8, 16, 0, 1, {{200, 200}},
     CAUSAL, 512, 1.0f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 0},
    {"tc: prefill d256 bf16 rep8 window 100 (bites), chunk at 230 + new seq + rows without keys, gate, dropped",
     BF16, 256, 256, 1, 8, 16, 0, 3, {{90, 320}, {70, 70}, {3, 0}},
     CAUSAL, 100, 1.0f, 0.0f, 1, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 1},
    {"tc: prefill d512 bf16 rep8 bs32 causal, chunk at 100 + new seq",
     BF16, 512, 512, 1, 8, 32, 0, 2, {{100, 200}, {80, 80}},
     CAUSAL, 0, 1.0f, 0.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 256, 64, 0},
    {"tc: prefill d512 bf16 rep8 window 512 (bites), chunk at 530, softcap, dropped blocks",
     BF16, 512, 512, 1, 8, 16, 0, 1, {{70, 600}},
     CAUSAL, 512, 1.0f, 30.0f, 0, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 256, 64, 1},
    {"tc: prefill d128 f16 rep4 two KV heads, window 50, gate (f16 MMA)",
     F16, 128, 128, 2, 4, 16, 1, 2, {{77, 77}, {40, 100}},
     CAUSAL, 50, 0.088388f, 0.0f, 1, BERTH_NORM_W, BERTH_NORM_UNIT, F16, HALF, 64, 64, 0},
    {"tc: mixed d256 bf16 rep8: chunk at 37 + decode rows + an empty seq, gate",
     BF16, 256, 256, 1, 8, 16, 0, 4, {{64, 101}, {1, 300}, {0, 9}, {1, 1}},
     CAUSAL, 512, 1.0f, 0.0f, 1, BERTH_NORM_W, BERTH_NORM_UNIT, BF16, HALF, 128, 128, 0},
    {"tc: prefill d192/dv128 bf16 rep2 padded head slots",
     BF16, 192, 128, 2, 2, 32, 3, 2, {{65, 65}, {20, 90}},
     CAUSAL, 0, 0.0721688f, 0.0f, 0, BERTH_NORM_W_NONE, BERTH_NORM_W_NONE, F32, HALF, 96, 32, 0},
    /* T == n_seqs without one row per sequence (rows 0 and 2): the prefill kernels, not the decode ones (a random
     * case, seed 1347276556 in session 15, whose second row the bf16 decode path got wrong) */
    {"T == n_seqs with rows 0 and 2, f16 d96/dv100 softcap",
     F16, 96, 100, 3, 1, 16, 3, 2, {{0, 6}, {2, 225}},
     CAUSAL, 0, 1.0f, 10.0f, 0, BERTH_NORM_W_NONE, BERTH_NORM_W_NONE, F32, INTERL, 0, 2, 1},
    {"tc: MASK_NONE prefill d64 bf16 rep16 bs8",
     BF16, 64, 64, 1, 16, 8, 0, 2, {{30, 70}, {50, 20}},
     NOMASK, 0, 0.125f, 0.0f, 1, BERTH_NORM_W, BERTH_NORM_W, BF16, INTERL, 0, 32, 0},
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

/* ---- Decode path on a random pool (no kv_append): every decode kernel variant (KV dtype x heads per KV head x
 * head dims, i.e. lanes per head dim and warps per team), one split and many, the window, aligned and unaligned
 * rows, block sizes that split a batch of keys; and graph replay: the op recorded once with the block table's
 * width as its bound, replayed with new lengths, positions, block tables and q, each replay against the CPU. ---- */

#define DEC_MAX_SEQS 24

struct dec_case {
    const char *name;
    berth_dtype kv_dt;
    int D, DV, n_kvh, n_rep, bs, layout; /* layout: as struct attn_case */
    int n_seqs;
    int kv_len[DEC_MAX_SEQS];
    int mask, window;
    float scale, softcap;
    int gate;
    int bt_w;    /* block-table width (0: the longest sequence's blocks + 1) */
    int replays; /* > 0: record the GPU op in a graph, then replay it with that many new sets of lengths */
};

/* Per sequence: block-table row (the first ceil(len / bs) entries from the sequence's own blocks, then values no
 * backend may read), position len - 1 (0 when empty). Uploaded to both sides. */
static void dec_set_lengths(const struct dec_case *dc, int bt_w, const int *blocks, const int *len,
                            struct hx_tensor *tbt, struct hx_tensor *tkv, struct hx_tensor *tpos)
{
    const int ns = dc->n_seqs;
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)ns * (size_t)bt_w);
    int32_t kvl[DEC_MAX_SEQS], pos[DEC_MAX_SEQS];
    ck_assert(bt);
    for (int s = 0; s < ns; s++) {
        const int nb = (len[s] + dc->bs - 1) / dc->bs;
        for (int b = 0; b < bt_w; b++)
            bt[s * bt_w + b] = b < nb ? blocks[s * bt_w + b] : (b & 1 ? 0x7fffffff : -1);
        kvl[s] = len[s];
        pos[s] = len[s] > 0 ? len[s] - 1 : 0;
    }
    hx_set(tbt, bt);
    hx_set(tkv, kvl);
    hx_set(tpos, pos);
    free(bt);
}

/* A decode call over a random pool, ready to run (dec_run and the kv_append + attention tests below): the case as
 * struct attn_case, a block table whose every slot owns a block of the pool (shuffled, so any length up to
 * bt_w * bs is valid data), random q and gate, one query row per sequence, and the sequences' lengths uploaded. */
struct dec_state {
    struct attn_case c;
    int bt_w, qmis; /* qmis: q rows start one element into theirs (layout 2: not 16-byte aligned either) */
    int *blocks;    /* [n_seqs][bt_w]: the pool block of each table slot */
    struct pool pool;
    struct hx_tensor q, out, gate, tpos, tqs, tkv, tbt;
};

/* room: keys every sequence may gain past dc->kv_len (a table of width dc->bt_w == 0 is sized for them). */
static void dec_setup(const struct dec_case *dc, int room, struct dec_state *st)
{
    memset(st, 0, sizeof *st);
    struct attn_case *c = &st->c;
    c->name = dc->name;
    c->kv_dt = dc->kv_dt;
    c->D = dc->D, c->DV = dc->DV, c->n_kvh = dc->n_kvh, c->n_rep = dc->n_rep, c->bs = dc->bs, c->layout = dc->layout;
    c->n_seqs = dc->n_seqs, c->mask = dc->mask, c->window = dc->window, c->scale = dc->scale;
    c->softcap = dc->softcap, c->gate = dc->gate;
    const int ns = dc->n_seqs, H = dc->n_kvh * dc->n_rep, T = ns;
    ck_assert(ns >= 1 && ns <= DEC_MAX_SEQS);
    int bt_w = dc->bt_w, max_kv = 0;
    for (int s = 0; s < ns; s++) {
        const int len = dc->kv_len[s] + room, nb = (len + dc->bs - 1) / dc->bs;
        if (dc->bt_w == 0 && nb + 1 > bt_w)
            bt_w = nb + 1;
        max_kv = len > max_kv ? len : max_kv;
    }
    ck_assert_msg(bt_w >= 1 && (int64_t)bt_w * dc->bs >= max_kv, "%s: table too narrow", dc->name);
    st->bt_w = bt_w;
    const int n_blocks = ns * bt_w + 1;
    st->blocks = malloc(sizeof(int) * (size_t)n_blocks);
    ck_assert(st->blocks);
    for (int i = 0; i < n_blocks; i++)
        st->blocks[i] = i;
    shuffle_int(st->blocks, n_blocks);
    pool_make(&st->pool, c, n_blocks); /* random contents, the same on both sides */

    st->qmis = dc->layout == 2;
    st->q = hx_new(BERTH_DTYPE_F32, dc->D + st->qmis, H, T, 0);
    st->out = hx_new(BERTH_DTYPE_F32, dc->DV, H, T, 0);
    st->gate = hx_new(BERTH_DTYPE_F32, dc->DV, H, T, 0);
    st->tpos = hx_new(BERTH_DTYPE_I32, T, 0, 0, 0);
    st->tqs = hx_new(BERTH_DTYPE_I32, ns + 1, 0, 0, 0);
    st->tkv = hx_new(BERTH_DTYPE_I32, ns, 0, 0, 0);
    st->tbt = hx_new(BERTH_DTYPE_I32, bt_w, ns, 0, 0);
    hx_rand(&st->q, -0.5f, 0.5f);
    hx_rand(&st->gate, -3.0f, 3.0f);
    int32_t qs[DEC_MAX_SEQS + 1];
    for (int s = 0; s <= ns; s++)
        qs[s] = s;
    hx_set(&st->tqs, qs);
    dec_set_lengths(dc, bt_w, st->blocks, dc->kv_len, &st->tbt, &st->tkv, &st->tpos);
}

/* The attention params of the decode call for one side; max_kv: the batch's longest sequence. */
static berth_attention_params dec_params(const struct dec_case *dc, const struct dec_state *st, int side, int max_kv)
{
    const int H = dc->n_kvh * dc->n_rep, T = dc->n_seqs, qrow = dc->D + st->qmis;
    berth_attention_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.mask = dc->mask;
    p.window = dc->window;
    p.scale = dc->scale;
    p.softcap = dc->softcap;
    p.n_seqs = dc->n_seqs;
    p.max_q_len = 1;
    p.max_kv_len = max_kv;
    p.q = view3(&st->q, side, st->qmis ? 4 : 0, dc->D, H, T, (int64_t)qrow * 4, (int64_t)qrow * 4 * H);
    p.out = st->out.t[side];
    if (dc->gate)
        p.gate = st->gate.t[side];
    p.positions = st->tpos.t[side];
    p.seq_q_start = st->tqs.t[side];
    p.seq_kv_len = st->tkv.t[side];
    p.block_table = st->tbt.t[side];
    p.kv = pool_view(&st->pool, side);
    return p;
}

static void dec_free(struct dec_state *st)
{
    hx_free(&st->q);
    hx_free(&st->out);
    hx_free(&st->gate);
    hx_free(&st->tpos);
    hx_free(&st->tqs);
    hx_free(&st->tkv);
    hx_free(&st->tbt);
    hx_free(&st->pool.mem);
    free(st->blocks);
}

/* The output check of a decode call: the tensor-core bound when that kernel ran (tensor_core_expected), else the
 * fp32 tolerance tol. The reference reads the CPU side's pool, tables and q. */
static void dec_expect(const struct dec_state *st, double tol, const char *what)
{
    const struct attn_case *c = &st->c;
    const int T = c->n_seqs;
    if (!tensor_core_expected(c, &st->pool, T)) {
        hx_expect_close(&st->out, tol, tol, what);
        return;
    }
    unsigned char *pb = malloc(st->pool.mem.bytes);
    int32_t *bt = malloc(st->tbt.bytes), *kvl = malloc(st->tkv.bytes), *pos = malloc(st->tpos.bytes);
    int32_t *qs = malloc(st->tqs.bytes);
    float *qh = malloc(st->q.bytes), *gh = malloc(st->gate.bytes);
    ck_assert(pb && bt && kvl && pos && qs && qh && gh);
    hx_get(&st->pool.mem, HX_CPU, pb);
    hx_get(&st->tbt, HX_CPU, bt);
    hx_get(&st->tkv, HX_CPU, kvl);
    hx_get(&st->tpos, HX_CPU, pos);
    hx_get(&st->tqs, HX_CPU, qs);
    hx_get_f32(&st->q, HX_CPU, qh);
    hx_get_f32(&st->gate, HX_CPU, gh);
    const struct ref_inputs in = {pb, bt, pos, qs, kvl, st->bt_w, T, qh, gh};
    expect_tensor_core_bound(c, &st->pool, &in, &st->out, tol, what);
    free(pb);
    free(bt);
    free(kvl);
    free(pos);
    free(qs);
    free(qh);
    free(gh);
}

static void dec_run(const struct dec_case *dc)
{
    struct dec_state st;
    dec_setup(dc, 0, &st);
    const int ns = dc->n_seqs, H = dc->n_kvh * dc->n_rep, T = ns;
    int max_kv = 0;
    for (int s = 0; s < ns; s++)
        max_kv = dc->kv_len[s] > max_kv ? dc->kv_len[s] : max_kv;
    berth_attention_params ap[2];
    for (int side = 0; side < 2; side++) {
        ap[side] = dec_params(dc, &st, side, max_kv);
        const berth_status s_op = hx_op(side, BERTH_OP_ATTENTION, &ap[side]);
        ck_assert_msg(s_op == BERTH_OK, "%s: attention on %s: status %d: %s", dc->name, side ? "cuda" : "cpu", s_op,
                      hx_last_error);
    }
    hx_sync();
    const double tol = att_tol(dc->scale, dc->D);
    char what[400];
    snprintf(what, sizeof what, "%s: attention output", dc->name);
    dec_expect(&st, tol, what);
    {
        float *o = malloc(sizeof(float) * (size_t)dc->DV * (size_t)H * (size_t)T);
        ck_assert(o);
        hx_get_f32(&st.out, HX_GPU, o);
        for (int s = 0; s < ns; s++)
            for (int64_t i = (int64_t)s * H * dc->DV; dc->kv_len[s] == 0 && i < (int64_t)(s + 1) * H * dc->DV; i++)
                ck_assert_msg(o[i] == 0.0f, "%s: seq %d has no keys but out[%lld] = %g", dc->name, s, (long long)i,
                              (double)o[i]);
        free(o);
    }

    if (dc->replays > 0) {
        const struct hx_side *g = &hx->side[HX_GPU];
        berth_graph *graph = NULL;
        ck_assert_msg(g->vt->graph_begin(g->be, g->s) == BERTH_OK, "%s: graph_begin: %s", dc->name, hx_last_error);
        const berth_status st_op = hx_op(HX_GPU, BERTH_OP_ATTENTION, &ap[HX_GPU]);
        char op_err[512];
        snprintf(op_err, sizeof op_err, "%s", hx_last_error);
        const berth_status st_end = g->vt->graph_end(g->be, g->s, &graph); /* ends the capture even on failure */
        ck_assert_msg(st_op == BERTH_OK, "%s: attention while recording: status %d: %s", dc->name, st_op, op_err);
        ck_assert_msg(st_end == BERTH_OK && graph, "%s: graph_end: %s", dc->name, hx_last_error);
        const int cap = st.bt_w * dc->bs;
        for (int r = 0; r < dc->replays; r++) {
            /* replay 0: every sequence at the table's capacity; 1: random lengths; then short ones (most splits
             * recorded for the capacity find nothing) with an empty sequence */
            int len[DEC_MAX_SEQS], mx = 0;
            for (int s = 0; s < ns; s++) {
                len[s] = r == 0 ? cap : r == 1 ? rnd(cap + 1) : (s == 0 ? 0 : 1 + rnd(cap < 40 ? cap : 40));
                mx = len[s] > mx ? len[s] : mx;
            }
            dec_set_lengths(dc, st.bt_w, st.blocks, len, &st.tbt, &st.tkv, &st.tpos);
            hx_rand(&st.q, -0.5f, 0.5f);
            ck_assert(g->vt->buffer_fill(g->be, g->s, st.out.buf[HX_GPU], 0, 0xFF, st.out.bytes) == BERTH_OK);
            ap[HX_CPU].max_kv_len = mx;
            const berth_status s_op = hx_op(HX_CPU, BERTH_OP_ATTENTION, &ap[HX_CPU]);
            ck_assert_msg(s_op == BERTH_OK, "%s: replay %d: attention on cpu: %s", dc->name, r, hx_last_error);
            ck_assert_msg(g->vt->graph_launch(g->be, g->s, graph) == BERTH_OK, "%s: graph_launch: %s", dc->name,
                          hx_last_error);
            hx_sync();
            snprintf(what, sizeof what, "%s: graph replay %d (lengths up to %d of %d)", dc->name, r, mx, cap);
            dec_expect(&st, tol, what);
        }
        g->vt->graph_destroy(g->be, graph);
    }
    dec_free(&st);
}

/* name, kv dtype, D, DV, n_kvh, n_rep, bs, layout, n_seqs, {kv_len...}, mask, window, scale, softcap, gate, bt_w,
 * replays */
static const struct dec_case dec_cases[] = {
    {"dec E2B sliding d256 bf16 rep8 bs16 window 512: one seq of 44 keys (one block, direct)",
     BF16, 256, 256, 1, 8, 16, 0, 1, {44}, CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"dec E2B sliding d256 bf16 rep8 bs16 window 512: one seq of 640 keys (window bites, splits)",
     BF16, 256, 256, 1, 8, 16, 0, 1, {640}, CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"dec E2B full d512 bf16 rep8 (two-warp teams): lengths 2000/640/1/0, gate",
     BF16, 512, 512, 1, 8, 16, 0, 4, {2000, 640, 1, 0}, CAUSAL, 0, 1.0f, 0.0f, 1, 0, 0},
    {"dec d256 bf16 rep8 window 512, 24 seqs of mixed lengths (fewer splits per seq)",
     BF16, 256, 256, 1, 8, 16, 0, 24,
     {700, 0, 1, 17, 64, 65, 300, 511, 512, 513, 90, 640, 33, 200, 5, 450, 600, 129, 2, 48, 256, 257, 380, 16},
     CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"dec rep16 d128 f16 (4 dims per lane, one warp per team), two KV heads",
     F16, 128, 128, 2, 16, 16, 0, 3, {300, 77, 1000}, CAUSAL, 0, 0.088388f, 0.0f, 1, 0, 0},
    {"dec rep16 d256 bf16 (teams of two warps) window 100, softcap",
     BF16, 256, 256, 1, 16, 32, 1, 2, {500, 150}, CAUSAL, 100, 0.0625f, 20.0f, 0, 0, 0},
    {"dec rep16 d512/dv510 f32 (teams of four warps), unaligned rows (element copies)",
     F32, 512, 510, 1, 16, 16, 2, 2, {260, 90}, CAUSAL, 0, 0.0441942f, 0.0f, 1, 0, 0},
    {"dec rep8 d512/dv320 f32 (two copies per slice) window 200, softcap, gate",
     F32, 512, 320, 1, 8, 16, 0, 2, {800, 333}, CAUSAL, 200, 0.0441942f, 15.0f, 1, 0, 0},
    {"dec rep5 d204/dv140 bf16 bs1 (every key its own block), padded head slots (a partial slice)",
     BF16, 204, 140, 2, 5, 1, 3, 3, {150, 97, 3}, CAUSAL, 0, 0.0700140f, 0.0f, 0, 0, 0},
    {"dec rep8 d512/dv500 bf16 bs3 unaligned rows, teams of two warps, MASK_NONE",
     BF16, 512, 500, 1, 8, 3, 2, 2, {120, 47}, NOMASK, 0, 0.0441942f, 0.0f, 0, 0, 0},
    {"dec rep2 d96 f16 bs8 window 300, many splits over a long row",
     F16, 96, 96, 3, 2, 8, 0, 2, {1500, 31}, CAUSAL, 300, 0.1020621f, 0.0f, 1, 0, 0},
    {"dec rep1 d64 bf16 bs16, one KV head per query head, long rows",
     BF16, 64, 64, 4, 1, 16, 1, 2, {3000, 100}, CAUSAL, 0, 0.125f, 0.0f, 0, 0, 0},
    /* graph replay (the op recorded with the table's capacity as its bound) */
    {"graph: E2B sliding d256 bf16 rep8 bs16 window 512, 4 seqs, table of 48 blocks",
     BF16, 256, 256, 1, 8, 16, 0, 4, {700, 100, 0, 33}, CAUSAL, 512, 1.0f, 0.0f, 0, 48, 3},
    {"graph: E2B full d512 bf16 rep8 bs16, 2 seqs, table of 40 blocks, gate",
     BF16, 512, 512, 1, 8, 16, 0, 2, {640, 1}, CAUSAL, 0, 1.0f, 0.0f, 1, 40, 3},
    {"graph: rep16 d256 f16 bs32 window 64, 3 seqs, table of 4 blocks (one block, direct)",
     F16, 256, 256, 1, 16, 32, 0, 3, {100, 1, 0}, CAUSAL, 64, 0.0625f, 0.0f, 0, 4, 3},
    /* the cluster kernel (attention_decode.cu): keys dealt round robin to cs * W warps (W = ADC_WARPS_OF: 8 for
     * narrow head groups, else 4), a cluster per (sequence, KV head, head group); its edges */
    {"cluster: E2B sliding d256 bf16 rep8: lengths 1, 511, 512 (== window), 513, 64, 65 (split boundaries)",
     BF16, 256, 256, 1, 8, 16, 0, 6, {1, 511, 512, 513, 64, 65}, CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"cluster: d256 bf16 rep8, rows of at most 16 keys (one block per head group, no cluster), gate",
     BF16, 256, 256, 1, 8, 16, 0, 4, {16, 3, 9, 0}, CAUSAL, 512, 1.0f, 0.0f, 1, 0, 0},
    {"cluster: rep4 d64 bf16 bs1, a table wider than the preloaded 1024 entries",
     BF16, 64, 64, 1, 4, 1, 0, 2, {1300, 20}, CAUSAL, 0, 0.125f, 0.0f, 0, 0, 0},
    {"cluster: rep4 d64 f32 bs1 window 1000, two KV heads (keys past the preloaded entries)",
     F32, 64, 64, 2, 4, 1, 1, 2, {2100, 1030}, CAUSAL, 1000, 0.125f, 0.0f, 1, 0, 0},
    {"graph: E2B full d512 bf16 rep8, 1 seq, table of 256 blocks (capacity 4096; a replay with 0 keys)",
     BF16, 512, 512, 1, 8, 16, 0, 1, {640}, CAUSAL, 0, 1.0f, 0.0f, 0, 256, 3},
    {"graph: E2B sliding d256 bf16 rep8 window 512, 8 seqs, table of 64 blocks, softcap",
     BF16, 256, 256, 1, 8, 16, 0, 8, {640, 1, 0, 512, 513, 100, 17, 1000}, CAUSAL, 512, 1.0f, 30.0f, 0, 64, 3},
    /* the same shapes on an f16 cache: the tensor-core decode kernel's f16 instances at head dim 256, the one-pass
     * ones (BERTH_CUDA_ATT_ONEPASS, the default) among them */
    {"graph: sliding d256 f16 rep8 window 512, 8 seqs, table of 64 blocks, softcap",
     F16, 256, 256, 1, 8, 16, 0, 8, {640, 1, 0, 512, 513, 100, 17, 1000}, CAUSAL, 512, 1.0f, 30.0f, 0, 64, 3},
    {"dec d256 f16 rep8 window 512, 24 seqs of mixed lengths",
     F16, 256, 256, 1, 8, 16, 0, 24,
     {700, 0, 1, 17, 64, 65, 300, 511, 512, 513, 90, 640, 33, 200, 5, 450, 600, 129, 2, 48, 256, 257, 380, 16},
     CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"graph: d512/dv500 f32 rep16 (four head groups) bs16 unaligned rows, 2 seqs, table of 20 blocks",
     F32, 512, 500, 1, 16, 16, 2, 2, {300, 2}, CAUSAL, 0, 0.0441942f, 0.0f, 1, 20, 3},
    /* "onepass:": the tensor-core kernel's head-dim-256 calls of 2..7 splits (longest row under the window's 512
     * keys, at most 64 keys a split: the one-pass instance; on an H200 the cases above have 8 or 1): splits and
     * sequences without keys, gate, softcap, f16, a graph replayed with shorter rows */
    {"onepass: d256 bf16 rep8 window 512, 12 seqs of at most 128 keys (2 splits), gate",
     BF16, 256, 256, 1, 8, 16, 0, 12, {128, 0, 1, 64, 65, 100, 127, 33, 96, 2, 128, 17}, CAUSAL, 512, 1.0f, 0.0f, 1,
     0, 0},
    {"onepass: d256 f16 rep8 window 512, 16 seqs of at most 300 keys (5 splits)",
     F16, 256, 256, 1, 8, 16, 0, 16, {300, 1, 0, 257, 64, 65, 129, 299, 200, 16, 250, 3, 192, 193, 100, 280}, CAUSAL,
     512, 1.0f, 0.0f, 0, 0, 0},
    {"onepass: d256 bf16 rep8 window 512, 8 seqs of at most 448 keys (7 splits), softcap",
     BF16, 256, 256, 1, 8, 16, 0, 8, {448, 385, 0, 1, 200, 447, 64, 321}, CAUSAL, 512, 1.0f, 30.0f, 0, 0, 0},
    {"graph: onepass d256 bf16 rep8 window 512, 9 seqs, table of 12 blocks (3 splits), gate",
     BF16, 256, 256, 1, 8, 16, 0, 9, {190, 0, 1, 100, 64, 129, 192, 5, 150}, CAUSAL, 512, 1.0f, 0.0f, 1, 12, 3},
};
#define N_DEC_CASES ((int)(sizeof dec_cases / sizeof dec_cases[0]))

START_TEST(attention_decode_matches_cpu)
{
    dec_run(&dec_cases[_i]);
}
END_TEST

/* ---- decode attention, then a product over its output (the o-projection) ------------------------------------
 *
 * In BF16 mode at 9..32 sequences (the default range) the tensor-core decode kernel's split merge also writes its
 * output rounded for the product that reads it next, which then skips its own pack of x (cuda_internal.h, struct
 * cu_xshadow). The product must see what the attention op wrote, and after an op in between (between = 1: out *= 2 in
 * place; 2: a product over other rows) the current rows, never a stale copy (that would be off by all of y). The 24
 * sequences of dec_cases[3]; the GPU's attention output differs from the CPU's within its bound, the product over
 * K = H * DV = 2048 with weights in [-0.2, 0.2] carries that difference, |y| is about 0.5. */
static void att_product_run(int between)
{
    const struct dec_case *dc = &dec_cases[3];
    struct dec_state st;
    dec_setup(dc, 0, &st);
    const int H = dc->n_kvh * dc->n_rep, T = dc->n_seqs;
    const int64_t K = (int64_t)H * dc->DV, N = 384;
    int max_kv = 0;
    for (int s = 0; s < T; s++)
        max_kv = dc->kv_len[s] > max_kv ? dc->kv_len[s] : max_kv;
    struct hx_tensor W = hx_new(BERTH_DTYPE_BF16, K, N, 0, 0), Y = hx_new(BERTH_DTYPE_F32, N, T, 0, 0);
    struct hx_tensor X3 = hx_new(BERTH_DTYPE_F32, K, T, 0, 0), Y3 = hx_new(BERTH_DTYPE_F32, N, T, 0, 0);
    hx_rand(&W, -0.2f, 0.2f);
    hx_rand(&X3, -0.5f, 0.5f);
    berth_attention_params ap[2];
    berth_matmul_params mp[2], other[2];
    for (int side = 0; side < 2; side++) {
        ap[side] = dec_params(dc, &st, side, max_kv);
        memset(&mp[side], 0, sizeof mp[side]);
        mp[side].struct_size = sizeof mp[side];
        mp[side].x = hx_view(&st.out, side, 0, K, T, 1, 1, K, K * T, K * T);
        mp[side].w = W.t[side];
        mp[side].y = Y.t[side];
        other[side] = mp[side];
        other[side].x = X3.t[side];
        other[side].y = Y3.t[side];
    }
    char what[200];
    snprintf(what, sizeof what, "attention (%d seqs, d%d) then a product over its output, between = %d", T, dc->D,
             between);
    hx_run_both(BERTH_OP_ATTENTION, &ap[HX_CPU], &ap[HX_GPU], what);
    if (between == 1)
        hx_scale_both(&st.out, 2.0f, what);
    if (between == 2)
        hx_run_both(BERTH_OP_MATMUL, &other[HX_CPU], &other[HX_GPU], what);
    hx_run_both(BERTH_OP_MATMUL, &mp[HX_CPU], &mp[HX_GPU], what);
    /* between = 1 doubles the attention output, and with it the difference the product carries (HX_SEED=1091471334:
     * 0.0605 against the single bound 0.05 + 0.02 |y|, the same with or without the product kernel's session-20
     * epilogue); a stale copy of x would still be off by half of y, ~0.25 */
    hx_expect_close(&Y, between == 1 ? 0.1 : 0.05, 0.02, what);
    if (between == 2)
        hx_expect_close(&Y3, 0.05, 0.02, what);
    hx_free(&W);
    hx_free(&Y);
    hx_free(&X3);
    hx_free(&Y3);
    dec_free(&st);
}

START_TEST(attention_then_product_matches_cpu)
{
    att_product_run(_i);
}
END_TEST

/* ---- kv_append, then attention right behind it (attention_decode.cu, "Reads before the PDL wait") ------------
 *
 * The decode kernels read the K/V of keys OLDER than the batch's own rows before their PDL wait, while the kernel
 * before them may still run, and the newest key (the one this step's kv_append writes) only after it. These tests
 * run the runner's order: a prior context filled through kv_append (synced), then per step kv_append of one new
 * token per sequence immediately followed by attention on the same stream with no host synchronisation between
 * them (only after the attention), against the CPU backend doing the same two ops. So that attention is really
 * launched while kv_append is queued or running, a long fill of a scratch buffer is enqueued just before the two
 * ops (the GPU is still busy with it when both have been launched). A kernel that read the new key before its
 * wait would see what the slot held before kv_append: NaN bytes (the GPU slot is poisoned right before each step),
 * so its output would not be finite. The graph test records [kv_append; attention] once and replays it with new
 * K/V (and q) of the new token uploaded on the stream before each replay: replay 0 over a poisoned slot, the
 * later ones over the previous replay's K/V (stale data, not NaN).
 *
 * The new K is planted so that a stale key or value cannot go unnoticed: for the first query head of each KV head
 * it is that head's q, so that head's score of the new key (|q|^2, about D / 12) dwarfs every other (about
 * N(0, D / 36)) and its output is the new V to about 1e-5. Each step checks that the CPU's attention run BEFORE
 * the append (over the stale slot) differs from the right output by more than 0.05 in that head: the comparison
 * would catch an early read whatever the timing. kv_append runs without norm and RoPE, so both backends store the
 * same bytes (the pools are checked equal) and both attention calls see identical caches. */

#define APP_STEPS 4
#define APP_REPLAYS 3
#define APP_BUSY_BYTES (256ull << 20) /* about 100 us of memset on an H200: far longer than two launches */
#define APP_STALE_MIN 0.05            /* least change a stale new key must make (the bounds are below 0.01) */

struct app_state {
    struct dec_state d;          /* the attention call (q, out, tables, the pool) */
    struct hx_tensor kvin;       /* the new tokens' K and V: {n_kvh * (D + DV), n_seqs} (K heads, then V heads) */
    struct hx_tensor slots;      /* {n_seqs}: the new tokens' slots */
    struct hx_tensor out_stale;  /* CPU side only: attention before this step's append */
    int len[DEC_MAX_SEQS];       /* keys of each sequence before this step's token */
    berth_kv_append_params kp[2];
    berth_attention_params ap[2], ap_stale;
};

static int32_t app_slot(const struct app_state *a, int s, int pos)
{
    const int bs = a->d.c.bs;
    return a->d.blocks[s * a->d.bt_w + pos / bs] * bs + pos % bs;
}

/* dec_setup with room for `room` new tokens per sequence, then dc->kv_len[s] keys of every sequence written
 * through kv_append on both sides (random K/V in [-1, 1]) and synced; the pools must then be equal. */
static void app_setup(const struct dec_case *dc, int room, struct app_state *a)
{
    memset(a, 0, sizeof *a);
    dec_setup(dc, room, &a->d);
    const struct attn_case *c = &a->d.c;
    const int ns = dc->n_seqs, H = dc->n_kvh * dc->n_rep, row = dc->n_kvh * (dc->D + dc->DV);
    a->kvin = hx_new(F32, row, ns, 0, 0);
    a->slots = hx_new(BERTH_DTYPE_I32, ns, 0, 0, 0);
    a->out_stale = hx_new(F32, dc->DV, H, ns, 0);
    int n = 0;
    for (int s = 0; s < ns; s++)
        n += a->len[s] = dc->kv_len[s];
    if (n > 0) {
        int32_t *sl = malloc(sizeof(int32_t) * (size_t)n);
        ck_assert(sl);
        for (int s = 0, i = 0; s < ns; s++)
            for (int p = 0; p < a->len[s]; p++)
                sl[i++] = app_slot(a, s, p);
        struct hx_tensor kv = hx_new(F32, row, n, 0, 0), ts = hx_new(BERTH_DTYPE_I32, n, 0, 0, 0);
        hx_rand(&kv, -1.0f, 1.0f);
        hx_set(&ts, sl);
        for (int side = 0; side < 2; side++) {
            const berth_kv_append_params p = append_params(c, &a->d.pool, side, &kv, &ts, NULL, NULL, NULL, NULL);
            const berth_status st = hx_op(side, BERTH_OP_KV_APPEND, &p);
            ck_assert_msg(st == BERTH_OK, "%s: kv_append of the prior context (%d keys) on %s: status %d: %s",
                          dc->name, n, side ? "cuda" : "cpu", st, hx_last_error);
        }
        hx_sync();
        hx_free(&kv);
        hx_free(&ts);
        free(sl);
    }
    char what[400];
    snprintf(what, sizeof what, "%s: KV pool after kv_append of the prior context", dc->name);
    hx_expect_equal(&a->d.pool.mem, what);
}

static void app_free(struct app_state *a)
{
    hx_free(&a->kvin);
    hx_free(&a->slots);
    hx_free(&a->out_stale);
    dec_free(&a->d);
}

/* This step's tables (synced): each sequence's new token at position len[s], its slot, lengths len[s] + 1, and
 * the params of both ops on both sides (ap_stale: the CPU's attention into out_stale). Returns the longest
 * sequence. */
static int app_prepare(const struct dec_case *dc, struct app_state *a)
{
    int newlen[DEC_MAX_SEQS], mx = 0;
    int32_t sl[DEC_MAX_SEQS];
    for (int s = 0; s < dc->n_seqs; s++) {
        newlen[s] = a->len[s] + 1;
        sl[s] = app_slot(a, s, a->len[s]);
        mx = newlen[s] > mx ? newlen[s] : mx;
    }
    dec_set_lengths(dc, a->d.bt_w, a->d.blocks, newlen, &a->d.tbt, &a->d.tkv, &a->d.tpos);
    hx_set(&a->slots, sl);
    for (int side = 0; side < 2; side++) {
        a->kp[side] = append_params(&a->d.c, &a->d.pool, side, &a->kvin, &a->slots, NULL, NULL, NULL, NULL);
        a->ap[side] = dec_params(dc, &a->d, side, mx);
    }
    a->ap_stale = a->ap[HX_CPU];
    a->ap_stale.out = a->out_stale.t[HX_CPU];
    return mx;
}

/* Upload host data to both sides of t: synced on the CPU side, left ordered on the GPU stream (buffer_upload has
 * read the data when it returns). */
static void app_upload(struct hx_tensor *t, const void *data)
{
    for (int side = 0; side < 2; side++) {
        const struct hx_side *x = &hx->side[side];
        ck_assert_msg(x->vt->buffer_upload(x->be, x->s, t->buf[side], 0, data, t->bytes) == BERTH_OK,
                      "upload on side %d: %s", side, hx_last_error);
    }
    const struct hx_side *cpu = &hx->side[HX_CPU];
    ck_assert_msg(cpu->vt->stream_sync(cpu->be, cpu->s) == BERTH_OK, "sync on the cpu side: %s", hx_last_error);
}

/* New q in [-0.5, 0.5) and the new tokens' K/V: K of KV head g = q of query head g * n_rep (planted, see above),
 * V in [-1, 1). */
static void app_new_token(struct app_state *a)
{
    const struct attn_case *c = &a->d.c;
    const int ns = c->n_seqs, H = c->n_kvh * c->n_rep, qrow = c->D + a->d.qmis, row = c->n_kvh * (c->D + c->DV);
    const size_t nq = (size_t)qrow * (size_t)H * (size_t)ns;
    float *q = malloc(sizeof(float) * nq), *kv = malloc(sizeof(float) * (size_t)row * (size_t)ns);
    ck_assert(q && kv);
    for (size_t i = 0; i < nq; i++)
        q[i] = hx_rand_uniform(-0.5f, 0.5f);
    for (int s = 0; s < ns; s++)
        for (int g = 0; g < c->n_kvh; g++) {
            const float *qh = q + ((size_t)s * H + (size_t)g * c->n_rep) * (size_t)qrow + a->d.qmis;
            float *k = kv + (size_t)s * row + (size_t)g * c->D;
            float *v = kv + (size_t)s * row + (size_t)c->n_kvh * c->D + (size_t)g * c->DV;
            memcpy(k, qh, sizeof(float) * (size_t)c->D);
            for (int d = 0; d < c->DV; d++)
                v[d] = hx_rand_uniform(-1.0f, 1.0f);
        }
    app_upload(&a->d.q, q);
    app_upload(&a->kvin, kv);
    free(q);
    free(kv);
}

/* NaN bytes into the GPU slots of this step's new tokens (K and V of every KV head), on the stream. */
static void app_poison_new_slots(const struct app_state *a)
{
    const struct hx_side *g = &hx->side[HX_GPU];
    const struct attn_case *c = &a->d.c;
    const berth_kv_view kv = pool_view(&a->d.pool, HX_GPU);
    const uint64_t es = dt_size(c->kv_dt);
    for (int s = 0; s < c->n_seqs; s++) {
        const uint64_t b = (uint64_t)a->d.blocks[s * a->d.bt_w + a->len[s] / c->bs];
        const uint64_t slot = (uint64_t)(a->len[s] % c->bs);
        for (int h = 0; h < c->n_kvh; h++) {
            const uint64_t k = kv.k_offset + b * kv.block_stride + slot * kv.token_stride +
                               (uint64_t)h * kv.head_stride;
            const uint64_t v = kv.v_offset + b * kv.block_stride + slot * kv.v_token_stride +
                               (uint64_t)h * kv.v_head_stride;
            ck_assert(g->vt->buffer_fill(g->be, g->s, kv.k_buf, k, 0xFF, (uint64_t)c->D * es) == BERTH_OK);
            ck_assert(g->vt->buffer_fill(g->be, g->s, kv.v_buf, v, 0xFF, (uint64_t)c->DV * es) == BERTH_OK);
        }
    }
}

/* The CPU's side of a step: attention over the stale slot (into out_stale), kv_append, attention. */
static void app_run_cpu(struct app_state *a, const char *what)
{
    berth_status st = hx_op(HX_CPU, BERTH_OP_ATTENTION, &a->ap_stale);
    ck_assert_msg(st == BERTH_OK, "%s: attention before the append on cpu: status %d: %s", what, st, hx_last_error);
    st = hx_op(HX_CPU, BERTH_OP_KV_APPEND, &a->kp[HX_CPU]);
    ck_assert_msg(st == BERTH_OK, "%s: kv_append on cpu: status %d: %s", what, st, hx_last_error);
    st = hx_op(HX_CPU, BERTH_OP_ATTENTION, &a->ap[HX_CPU]);
    ck_assert_msg(st == BERTH_OK, "%s: attention on cpu: status %d: %s", what, st, hx_last_error);
}

/* After the sync: the stale slot would show (CPU), then the GPU's output against the CPU's. */
static void app_check(const struct dec_case *dc, const struct app_state *a, const char *what)
{
    const int ns = dc->n_seqs, H = dc->n_kvh * dc->n_rep, DV = dc->DV;
    const size_t n = (size_t)DV * (size_t)H * (size_t)ns;
    float *o = malloc(sizeof(float) * n), *os = malloc(sizeof(float) * n);
    ck_assert(o && os);
    hx_get_f32(&a->d.out, HX_CPU, o);
    hx_get_f32(&a->out_stale, HX_CPU, os);
    for (int s = 0; s < ns; s++)
        for (int g = 0; g < dc->n_kvh; g++) {
            const size_t o0 = ((size_t)s * H + (size_t)g * dc->n_rep) * (size_t)DV;
            double diff = 0.0;
            for (int d = 0; d < DV; d++)
                diff = fmax(diff, fabs((double)o[o0 + d] - (double)os[o0 + d]));
            ck_assert_msg(diff > APP_STALE_MIN,
                          "%s: seq %d, head %d: the CPU's attention over the stale slot differs from the right output "
                          "by only %.3g (<= %g): an early read of the new key would go unnoticed (seed %llu)",
                          what, s, g * dc->n_rep, diff, APP_STALE_MIN, (unsigned long long)hx->seed);
        }
    free(o);
    free(os);
    dec_expect(&a->d, att_tol(dc->scale, dc->D), what);
}

/* name, kv dtype, D, DV, n_kvh, n_rep, bs, layout, n_seqs, {keys before the first new token...}, mask, window,
 * scale, softcap, gate, bt_w (0: sized for the new tokens), replays (unused) */
static const struct dec_case app_cases[] = {
    {"E2B sliding d256 bf16 rep8 window 512, 1 seq of 600 keys before (the window bites)",
     BF16, 256, 256, 1, 8, 16, 0, 1, {600}, CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"E2B full d512 bf16 rep8, 1 seq of 300 keys before",
     BF16, 512, 512, 1, 8, 16, 0, 1, {300}, CAUSAL, 0, 1.0f, 0.0f, 0, 0, 0},
    {"E2B full d512 bf16 rep8, 3 seqs of 0/77/900 keys before",
     BF16, 512, 512, 1, 8, 16, 0, 3, {0, 77, 900}, CAUSAL, 0, 1.0f, 0.0f, 0, 0, 0},
    {"E2B sliding d256 bf16 rep8 window 512, 3 seqs of 509/2/1000 keys before (the first reaches the window)",
     BF16, 256, 256, 1, 8, 16, 0, 3, {509, 2, 1000}, CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"E2B sliding d256 bf16 rep8 window 512, 8 seqs of 0/1/15/16/300/511/700/1000 keys before",
     BF16, 256, 256, 1, 8, 16, 0, 8, {0, 1, 15, 16, 300, 511, 700, 1000}, CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"E2B full d512 bf16 rep8, 8 seqs of 1/2/31/32/100/200/400/900 keys before",
     BF16, 512, 512, 1, 8, 16, 0, 8, {1, 2, 31, 32, 100, 200, 400, 900}, CAUSAL, 0, 1.0f, 0.0f, 0, 0, 0},
    {"sliding d256 f32 cache rep8 window 512, 3 seqs of 40/600/3 keys before",
     F32, 256, 256, 1, 8, 16, 0, 3, {40, 600, 3}, CAUSAL, 512, 1.0f, 0.0f, 0, 0, 0},
    {"full d512 bf16 rep8, 1 seq of 1100 keys before (past the cluster kernel's 1024 keys)",
     BF16, 512, 512, 1, 8, 16, 0, 1, {1100}, CAUSAL, 0, 1.0f, 0.0f, 0, 0, 0},
};
#define N_APP_CASES ((int)(sizeof app_cases / sizeof app_cases[0]))

/* APP_STEPS steps of [kv_append; attention] enqueued back to back behind a long fill, synced after both. */
START_TEST(attention_right_after_kv_append_matches_cpu)
{
    const struct dec_case *dc = &app_cases[_i];
    const struct hx_side *g = &hx->side[HX_GPU];
    struct app_state a;
    app_setup(dc, APP_STEPS, &a);
    berth_buffer *busy = NULL;
    ck_assert_msg(g->vt->buffer_alloc(g->be, APP_BUSY_BYTES, BERTH_USAGE_ACTIVATIONS, &busy) == BERTH_OK,
                  "%s: buffer_alloc of the scratch buffer: %s", dc->name, hx_last_error);
    char what[512];
    for (int step = 0; step < APP_STEPS; step++) {
        const int mx = app_prepare(dc, &a);
        app_new_token(&a);
        hx_sync();
        snprintf(what, sizeof what, "%s: step %d of %d (seq 0's new token at position %d, longest seq %d keys)",
                 dc->name, step, APP_STEPS, a.len[0], mx);
        ck_assert(g->vt->buffer_fill(g->be, g->s, a.d.out.buf[HX_GPU], 0, 0xFF, a.d.out.bytes) == BERTH_OK);
        app_poison_new_slots(&a);
        ck_assert(g->vt->buffer_fill(g->be, g->s, busy, 0, (uint8_t)step, APP_BUSY_BYTES) == BERTH_OK);
        berth_status st = hx_op(HX_GPU, BERTH_OP_KV_APPEND, &a.kp[HX_GPU]);
        ck_assert_msg(st == BERTH_OK, "%s: kv_append on cuda: status %d: %s", what, st, hx_last_error);
        st = hx_op(HX_GPU, BERTH_OP_ATTENTION, &a.ap[HX_GPU]); /* no sync before it */
        ck_assert_msg(st == BERTH_OK, "%s: attention on cuda: status %d: %s", what, st, hx_last_error);
        app_run_cpu(&a, what);
        hx_sync();
        app_check(dc, &a, what);
        for (int s = 0; s < dc->n_seqs; s++)
            a.len[s]++;
    }
    snprintf(what, sizeof what, "%s: KV pool after %d steps", dc->name, APP_STEPS);
    hx_expect_equal(&a.d.pool.mem, what);
    g->vt->buffer_free(g->be, busy);
    app_free(&a);
}
END_TEST

/* [kv_append; attention] recorded once, replayed APP_REPLAYS times with new K/V and q uploaded on the stream. */
START_TEST(attention_after_kv_append_graph_matches_cpu)
{
    const struct dec_case *dc = &app_cases[_i];
    const struct hx_side *g = &hx->side[HX_GPU];
    ck_assert_ptr_nonnull(g->vt->graph_begin);
    struct app_state a;
    app_setup(dc, 1, &a);
    const int mx = app_prepare(dc, &a);
    berth_graph *graph = NULL;
    ck_assert_msg(g->vt->graph_begin(g->be, g->s) == BERTH_OK, "%s: graph_begin: %s", dc->name, hx_last_error);
    char app_err[512] = "", att_err[512] = "";
    const berth_status st_app = hx_op(HX_GPU, BERTH_OP_KV_APPEND, &a.kp[HX_GPU]);
    snprintf(app_err, sizeof app_err, "%s", hx_last_error);
    /* a failing op aborts the recording: nothing more to record then */
    const berth_status st_att = st_app == BERTH_OK ? hx_op(HX_GPU, BERTH_OP_ATTENTION, &a.ap[HX_GPU]) : BERTH_OK;
    snprintf(att_err, sizeof att_err, "%s", hx_last_error);
    const berth_status st_end = g->vt->graph_end(g->be, g->s, &graph); /* ends the capture even on failure */
    ck_assert_msg(st_app == BERTH_OK, "%s: kv_append while recording: status %d: %s", dc->name, st_app, app_err);
    ck_assert_msg(st_att == BERTH_OK, "%s: attention while recording: status %d: %s", dc->name, st_att, att_err);
    ck_assert_msg(st_end == BERTH_OK && graph, "%s: graph_end: %s", dc->name, hx_last_error);
    char what[512];
    for (int r = 0; r < APP_REPLAYS; r++) {
        snprintf(what, sizeof what, "%s: graph replay %d of %d (seq 0's new token at position %d, longest seq %d "
                 "keys; slot before the replay: %s)", dc->name, r, APP_REPLAYS, a.len[0], mx,
                 r == 0 ? "NaN" : "the previous replay's K/V");
        app_new_token(&a); /* the GPU side stays queued on the stream, before the replay */
        ck_assert(g->vt->buffer_fill(g->be, g->s, a.d.out.buf[HX_GPU], 0, 0xFF, a.d.out.bytes) == BERTH_OK);
        if (r == 0)
            app_poison_new_slots(&a);
        ck_assert_msg(g->vt->graph_launch(g->be, g->s, graph) == BERTH_OK, "%s: graph_launch: %s", what,
                      hx_last_error);
        app_run_cpu(&a, what);
        hx_sync();
        app_check(dc, &a, what);
    }
    g->vt->graph_destroy(g->be, graph);
    snprintf(what, sizeof what, "%s: KV pool after %d graph replays", dc->name, APP_REPLAYS);
    hx_expect_equal(&a.d.pool.mem, what);
    app_free(&a);
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
    tcase_add_loop_test(tc, attention_decode_matches_cpu, 0, N_DEC_CASES);
    tcase_add_loop_test(tc, attention_then_product_matches_cpu, 0, 3);
    suite_add_tcase(s, tc);
    /* kv_append and attention back to back, no host sync between them (CK_RUN_CASE=append_attention) */
    tc = tcase_create("append_attention");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, attention_right_after_kv_append_matches_cpu, 0, N_APP_CASES);
    tcase_add_loop_test(tc, attention_after_kv_append_graph_matches_cpu, 0, N_APP_CASES);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    return hx_main(argc, argv, make_suite);
}

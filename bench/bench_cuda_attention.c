/*
 * bench_cuda_attention.c — the CUDA backend's decode attention (ATTENTION with one query row per sequence) on
 * Gemma 4 E2B shapes: 8 query heads on 1 KV head, bf16 paged cache, block size 16, scale 1; sliding layers (head
 * dim 256, window 512) and full layers (head dim 512, no window); n_seqs 1, 8, 32, 128; contexts 64, 640, 4096.
 *
 * Per shape it prints microseconds per call and the effective bandwidth of the K/V bytes a call must read
 * (n_seqs x visible keys x (D + DV) x 2 bytes), two ways, both timed by wall clock around stream_sync:
 *   eager  ITERS calls enqueued back to back, then one stream_sync: per-call time, or the host's launch cost
 *          when that is larger (it is for the smallest shapes);
 *   graph  GRAPH_CALLS calls recorded in one graph (launch sizes from the block table's width, as the runner's
 *          decode graphs), the graph replayed REPLAYS times: per-call device time without host launch costs.
 * The block table is exactly as wide as the context (the runner rounds widths up to a power of two, which can
 * make its graphs use more splits than needed). Outputs are checked to be finite.
 *
 * Prefill: one 2048-token sequence (positions 0..2047, all its keys in the cache), the same heads and layers,
 * eager, with the fast prefill kernel (attention_prefill.cu) and with BERTH_CUDA_ATT_PREFILL=old (attention.cu's
 * tensor-core kernel); prints microseconds per call, TFLOP/s over the visible (query, key) pairs (2 (D + DV)
 * FLOPs each per head), and the largest |new - old| of the outputs (both round q and P to bf16, so they differ by
 * about that rounding, not more).
 *
 * Decode A/B: the decode shapes run on two backend instances of the same device, A initialised with the
 * environment as given (BERTH_CUDA_ATT_DECODE unset: attention_decode.cu's cluster kernel) and B with
 * BERTH_CUDA_ATT_DECODE=$BENCH_DECODE_B (default old: attention.cu's split-K kernel + combine; the switch is read
 * when a backend starts), on identical inputs; each row prints both, the graph-time ratio B / A, and the largest
 * |A - B| of the outputs (both are fp32 throughout: above 1e-4 is reported as a MISMATCH and fails the run).
 *
 * Usage: bench_cuda_attention [cuda-plugin.so]   (BENCH_ITERS=N: eager calls per shape, default 200;
 *        BENCH_PREFILL_ONLY=1: skip the decode shapes; BENCH_DECODE_B=old|c8|new|none: the B side, none = A only)
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <berth/backend.h>

#ifndef CUDA_PLUGIN_PATH
#define CUDA_PLUGIN_PATH "plugins/berth-backend-cuda.so"
#endif

#define N_HEADS 8
#define BLOCK 16
#define MAX_SEQS 128
#define MAX_CTX 4096
#define GRAPH_CALLS 20
#define REPLAYS 20

static const berth_backend_vtable *vt;
static const berth_ops *ops; /* the side in use (use_side) */
static berth_backend *be;
static berth_stream *st;
static char last_error[512];

/* A backend instance with its stream; side 0 (A) and side 1 (B) of the decode A/B. */
struct side {
    berth_backend *be;
    const berth_ops *ops;
    berth_stream *st;
};
static struct side sides[2];

static void use_side(int i)
{
    be = sides[i].be;
    ops = sides[i].ops;
    st = sides[i].st;
}

static void host_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx;
    if (level <= BERTH_LOG_WARN)
        fprintf(stderr, "cuda: %s\n", msg);
}
static void host_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    (void)code;
    snprintf(last_error, sizeof last_error, "%s", msg);
}
static const char *host_config_get(berth_host_ctx *ctx, const char *key)
{
    (void)ctx;
    (void)key;
    return NULL; /* defaults: BF16 compute (attention is fp32 either way) */
}
static berth_status host_config_at(berth_host_ctx *ctx, int32_t idx, const char **key, const char **value)
{
    (void)ctx;
    (void)idx;
    *key = *value = NULL;
    return BERTH_E_NOT_FOUND;
}

static void check(berth_status s, const char *what)
{
    if (s != BERTH_OK) {
        fprintf(stderr, "%s: status %d: %s\n", what, (int)s, last_error);
        exit(1);
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rand32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float randf(void) /* [-1, 1) */
{
    return (float)(rand32() & 0xffffff) / 8388608.0f - 1.0f;
}

static berth_buffer *alloc(uint64_t bytes, int32_t usage)
{
    berth_buffer *b = NULL;
    check(vt->buffer_alloc(be, bytes, usage, &b), "buffer_alloc");
    return b;
}

static void upload(berth_buffer *b, uint64_t off, const void *data, uint64_t bytes)
{
    check(vt->buffer_upload(be, st, b, off, data, bytes), "buffer_upload");
    check(vt->stream_sync(be, st), "stream_sync");
}

static berth_tensor tensor(berth_buffer *b, berth_dtype dt, int64_t es, int64_t ne0, int64_t ne1, int64_t ne2)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.buf = b;
    t.dtype = dt;
    t.ndim = 3;
    t.ne[0] = ne0, t.ne[1] = ne1, t.ne[2] = ne2, t.ne[3] = 1;
    t.nb[0] = es, t.nb[1] = es * ne0, t.nb[2] = t.nb[1] * ne1, t.nb[3] = t.nb[2] * ne2;
    return t;
}

/* One layer's pool for head dim D: per block [K: BLOCK x D][V: BLOCK x D] bf16 (one KV head), random values. */
static berth_buffer *make_pool(int D, int n_blocks)
{
    const uint64_t bytes = (uint64_t)n_blocks * BLOCK * 2u * (uint64_t)D * 2u;
    berth_buffer *b = alloc(bytes, BERTH_USAGE_KV);
    const uint64_t chunk = 8u << 20;
    uint16_t *h = malloc(chunk);
    if (!h)
        exit(1);
    const uint64_t saved = rng; /* the same contents for every side, the caller's sequence unchanged */
    rng = 0x2545F4914F6CDD1Dull ^ (uint64_t)D;
    for (uint64_t i = 0; i < chunk / 2; i++) {
        const float f = randf();
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (uint16_t)(u >> 16);
    }
    rng = saved;
    for (uint64_t off = 0; off < bytes; off += chunk)
        upload(b, off, h, bytes - off < chunk ? bytes - off : chunk);
    free(h);
    return b;
}

/* The view of a make_pool() pool: one KV head of head dim D, K then V in each block, bf16. */
static berth_kv_view pool_view(berth_buffer *pool, int D, int n_blocks)
{
    berth_kv_view kv;
    memset(&kv, 0, sizeof kv);
    kv.k_buf = kv.v_buf = pool;
    kv.k_offset = 0;
    kv.v_offset = (uint64_t)BLOCK * (uint64_t)D * 2u;
    kv.block_stride = (uint64_t)BLOCK * 2u * (uint64_t)D * 2u;
    kv.token_stride = kv.head_stride = (uint64_t)D * 2u;
    kv.v_token_stride = kv.v_head_stride = (uint64_t)D * 2u;
    kv.dtype = BERTH_DTYPE_BF16;
    kv.block_size = BLOCK;
    kv.n_blocks = n_blocks;
    kv.n_kv_heads = 1;
    kv.head_dim = kv.head_dim_v = D;
    return kv;
}

static double run_eager(const berth_attention_params *p, int iters)
{
    for (int i = 0; i < 3; i++)
        check(ops->attention(be, st, p), "attention (warm-up)");
    check(vt->stream_sync(be, st), "stream_sync");
    const double t0 = now();
    for (int i = 0; i < iters; i++)
        check(ops->attention(be, st, p), "attention");
    check(vt->stream_sync(be, st), "stream_sync");
    return (now() - t0) / iters;
}

static double run_graph(const berth_attention_params *p)
{
    berth_graph *g = NULL;
    check(vt->graph_begin(be, st), "graph_begin");
    for (int i = 0; i < GRAPH_CALLS; i++) {
        const berth_status s = ops->attention(be, st, p);
        if (s != BERTH_OK) {
            fprintf(stderr, "attention while recording: %s\n", last_error);
            (void)vt->graph_end(be, st, &g);
            exit(1);
        }
    }
    check(vt->graph_end(be, st, &g), "graph_end");
    check(vt->graph_launch(be, st, g), "graph_launch (warm-up)");
    check(vt->stream_sync(be, st), "stream_sync");
    const double t0 = now();
    for (int i = 0; i < REPLAYS; i++)
        check(vt->graph_launch(be, st, g), "graph_launch");
    check(vt->stream_sync(be, st), "stream_sync");
    const double dt = (now() - t0) / (REPLAYS * GRAPH_CALLS);
    vt->graph_destroy(be, g);
    return dt;
}

#define PF_T 2048

/* The prefill shape on pool (head dim D, window) with scattered blocks perm; new and old kernel. Returns the
 * number of non-finite outputs. */
static int bench_prefill(berth_buffer *pool, int n_blocks, const int32_t *perm, int D, int window, int iters)
{
    const int bt_w = PF_T / BLOCK;
    const uint64_t qbytes = sizeof(float) * (uint64_t)D * N_HEADS * PF_T;
    float *hq = malloc(qbytes), *hnew = malloc(qbytes), *hold = malloc(qbytes);
    int32_t *hi = malloc(sizeof(int32_t) * PF_T);
    if (!hq || !hnew || !hold || !hi)
        exit(1);
    berth_buffer *qb = alloc(qbytes, BERTH_USAGE_ACTIVATIONS), *ob = alloc(qbytes, BERTH_USAGE_ACTIVATIONS);
    berth_buffer *posb = alloc(4u * PF_T, BERTH_USAGE_ACTIVATIONS), *qsb = alloc(8u, BERTH_USAGE_ACTIVATIONS);
    berth_buffer *kvb = alloc(4u, BERTH_USAGE_ACTIVATIONS), *btb = alloc(4u * (uint64_t)bt_w, BERTH_USAGE_ACTIVATIONS);
    for (uint64_t i = 0; i < qbytes / sizeof(float); i++)
        hq[i] = 0.5f * randf();
    upload(qb, 0, hq, qbytes);
    for (int i = 0; i < PF_T; i++)
        hi[i] = i;
    upload(posb, 0, hi, 4u * PF_T);
    const int32_t qs[2] = {0, PF_T}, kvl = PF_T;
    upload(qsb, 0, qs, sizeof qs);
    upload(kvb, 0, &kvl, sizeof kvl);
    for (int b = 0; b < bt_w; b++)
        hi[b] = perm[b] % n_blocks;
    upload(btb, 0, hi, 4u * (uint64_t)bt_w);

    berth_attention_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.mask = BERTH_MASK_CAUSAL;
    p.window = window;
    p.scale = 1.0f;
    p.n_seqs = 1;
    p.max_q_len = PF_T;
    p.max_kv_len = PF_T;
    p.q = tensor(qb, BERTH_DTYPE_F32, 4, D, N_HEADS, PF_T);
    p.out = tensor(ob, BERTH_DTYPE_F32, 4, D, N_HEADS, PF_T);
    p.positions = tensor(posb, BERTH_DTYPE_I32, 4, PF_T, 1, 1);
    p.seq_q_start = tensor(qsb, BERTH_DTYPE_I32, 4, 2, 1, 1);
    p.seq_kv_len = tensor(kvb, BERTH_DTYPE_I32, 4, 1, 1, 1);
    p.block_table = tensor(btb, BERTH_DTYPE_I32, 4, bt_w, 1, 1);
    p.kv = pool_view(pool, D, n_blocks);

    double pairs = 0.0;
    for (int t = 0; t < PF_T; t++)
        pairs += window > 0 && window < t + 1 ? window : t + 1;
    const double flops = pairs * N_HEADS * 2.0 * (2.0 * D);
    const int n_iters = iters / 4 > 10 ? iters / 4 : 10;
    const char *prev = getenv("BERTH_CUDA_ATT_PREFILL");
    char *saved = prev ? strdup(prev) : NULL;
    unsetenv("BERTH_CUDA_ATT_PREFILL");
    const double tn = run_eager(&p, n_iters);
    check(vt->buffer_download(be, st, ob, 0, hnew, qbytes), "buffer_download");
    check(vt->stream_sync(be, st), "stream_sync");
    setenv("BERTH_CUDA_ATT_PREFILL", "old", 1);
    const double to = run_eager(&p, n_iters);
    check(vt->buffer_download(be, st, ob, 0, hold, qbytes), "buffer_download");
    check(vt->stream_sync(be, st), "stream_sync");
    if (saved)
        setenv("BERTH_CUDA_ATT_PREFILL", saved, 1);
    else
        unsetenv("BERTH_CUDA_ATT_PREFILL");
    free(saved);
    int nonfinite = 0;
    double maxdiff = 0.0;
    for (uint64_t i = 0; i < qbytes / sizeof(float); i++) {
        nonfinite += !isfinite(hnew[i]) || !isfinite(hold[i]);
        const double d = fabs((double)hnew[i] - (double)hold[i]);
        maxdiff = d > maxdiff ? d : maxdiff;
    }
    printf("  prefill T %d: new %8.1f us %6.1f TFLOP/s | old %8.1f us %6.1f TFLOP/s | x%.2f | max |new - old| %.3g%s\n",
           PF_T, tn * 1e6, flops / tn * 1e-12, to * 1e6, flops / to * 1e-12, to / tn, maxdiff,
           nonfinite ? "  NON-FINITE OUTPUT" : "");
    fflush(stdout);
    vt->buffer_free(be, qb);
    vt->buffer_free(be, ob);
    vt->buffer_free(be, posb);
    vt->buffer_free(be, qsb);
    vt->buffer_free(be, kvb);
    vt->buffer_free(be, btb);
    free(hq);
    free(hnew);
    free(hold);
    free(hi);
    return nonfinite;
}

/* Per-side device buffers of the decode shapes. */
struct side_bufs {
    berth_buffer *q, *o, *pos, *qs, *kv, *bt, *pool;
};

static berth_attention_params decode_params(const struct side_bufs *b, int D, int window, int n, int ctx, int bt_w,
                                            int n_blocks)
{
    berth_attention_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.mask = BERTH_MASK_CAUSAL;
    p.window = window;
    p.scale = 1.0f;
    p.n_seqs = n;
    p.max_q_len = 1;
    p.max_kv_len = ctx;
    p.q = tensor(b->q, BERTH_DTYPE_F32, 4, D, N_HEADS, n);
    p.out = tensor(b->o, BERTH_DTYPE_F32, 4, D, N_HEADS, n);
    p.positions = tensor(b->pos, BERTH_DTYPE_I32, 4, n, 1, 1);
    p.seq_q_start = tensor(b->qs, BERTH_DTYPE_I32, 4, n + 1, 1, 1);
    p.seq_kv_len = tensor(b->kv, BERTH_DTYPE_I32, 4, n, 1, 1);
    p.block_table = tensor(b->bt, BERTH_DTYPE_I32, 4, bt_w, n, 1);
    p.kv = pool_view(b->pool, D, n_blocks);
    return p;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : CUDA_PLUGIN_PATH;
    const char *it_env = getenv("BENCH_ITERS");
    const int iters = it_env && atoi(it_env) > 0 ? atoi(it_env) : 200;
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(so, BERTH_PLUGIN_ENTRY_SYMBOL);
    if (!entry) {
        fprintf(stderr, "%s: no %s\n", path, BERTH_PLUGIN_ENTRY_SYMBOL);
        return 1;
    }
    const berth_plugin_desc *d = entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    if (!d) {
        fprintf(stderr, "%s: entry refused ABI %d.%d\n", path, BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
        return 1;
    }
    vt = (const berth_backend_vtable *)d->vtable;
    static berth_host host;
    host.struct_size = (uint32_t)BERTH_SIZE_TO(berth_host, config_at);
    host.abi_major = BERTH_ABI_MAJOR;
    host.abi_minor = BERTH_ABI_MINOR;
    host.host_version = "bench-cuda-attention";
    host.services = BERTH_SVC_LOG | BERTH_SVC_CONFIG;
    host.log = host_log;
    host.set_error = host_set_error;
    host.config_get = host_config_get;
    host.config_at = host_config_at;
    berth_probe_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    check(vt->probe(&host, &pi), "probe");
    if (pi.n_devices < 1) {
        printf("no CUDA device: %s\n", pi.message);
        return 77;
    }
    berth_device_info di;
    memset(&di, 0, sizeof di);
    di.struct_size = sizeof di;
    check(vt->device_info(&host, 0, &di), "device_info");

    /* Side A: the environment as given. Side B: BERTH_CUDA_ATT_DECODE=$BENCH_DECODE_B while it starts. */
    const char *a_env = getenv("BERTH_CUDA_ATT_DECODE");
    char a_name[64];
    snprintf(a_name, sizeof a_name, "%s", a_env && *a_env ? a_env : "new");
    const char *b_env = getenv("BENCH_DECODE_B");
    char b_name[64];
    snprintf(b_name, sizeof b_name, "%s", b_env && *b_env ? b_env : "old");
    const int n_sides = strcmp(b_name, "none") == 0 ? 1 : 2;
    check(vt->init(&host, 0, &sides[0].be), "init (A)");
    if (n_sides > 1) {
        char *saved = a_env ? strdup(a_env) : NULL;
        setenv("BERTH_CUDA_ATT_DECODE", b_name, 1);
        check(vt->init(&host, 0, &sides[1].be), "init (B)");
        if (saved)
            setenv("BERTH_CUDA_ATT_DECODE", saved, 1);
        else
            unsetenv("BERTH_CUDA_ATT_DECODE");
        free(saved);
    }
    for (int i = 0; i < n_sides; i++) {
        sides[i].ops = vt->get_ops(sides[i].be);
        check(vt->stream_create(sides[i].be, &sides[i].st), "stream_create");
    }
    use_side(0);
    printf("%s, %d SMs: decode attention, %d query heads / 1 KV head, bf16 KV, block %d\n", di.name,
           (int)di.compute_units, N_HEADS, BLOCK);
    printf("decode A: BERTH_CUDA_ATT_DECODE=%s; B: %s\n", a_name, n_sides > 1 ? b_name : "(none)");

    static const int seqs_list[] = {1, 8, 32, 128};
    static const int ctx_list[] = {64, 640, 4096};
    static const int dims[] = {256, 512};
    const int n_blocks = MAX_SEQS * (MAX_CTX / BLOCK);
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    int32_t *host_i = malloc(sizeof(int32_t) * (size_t)n_blocks);
    float *host_q = malloc(sizeof(float) * (size_t)512 * N_HEADS * MAX_SEQS);
    float *host_o[2] = {malloc(sizeof(float) * (size_t)512 * N_HEADS * MAX_SEQS),
                        malloc(sizeof(float) * (size_t)512 * N_HEADS * MAX_SEQS)};
    if (!perm || !host_i || !host_q || !host_o[0] || !host_o[1])
        return 1;
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { /* scattered blocks, as a real pool after a while */
        const int j = (int)(rand32() % (uint32_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int i = 0; i < 512 * N_HEADS * MAX_SEQS; i++)
        host_q[i] = 0.5f * randf();
    struct side_bufs bufs[2];
    memset(bufs, 0, sizeof bufs);
    for (int sd = 0; sd < n_sides; sd++) {
        use_side(sd);
        struct side_bufs *b = &bufs[sd];
        b->q = alloc(sizeof(float) * 512u * N_HEADS * MAX_SEQS, BERTH_USAGE_ACTIVATIONS);
        b->o = alloc(sizeof(float) * 512u * N_HEADS * MAX_SEQS, BERTH_USAGE_ACTIVATIONS);
        b->pos = alloc(4u * MAX_SEQS, BERTH_USAGE_ACTIVATIONS);
        b->qs = alloc(4u * (MAX_SEQS + 1), BERTH_USAGE_ACTIVATIONS);
        b->kv = alloc(4u * MAX_SEQS, BERTH_USAGE_ACTIVATIONS);
        b->bt = alloc(4u * (uint64_t)n_blocks, BERTH_USAGE_ACTIVATIONS);
        upload(b->q, 0, host_q, sizeof(float) * 512u * N_HEADS * MAX_SEQS);
        for (int i = 0; i <= MAX_SEQS; i++)
            host_i[i] = i;
        upload(b->qs, 0, host_i, 4u * (MAX_SEQS + 1));
    }

    int bad = 0;
    for (int di_ = 0; di_ < 2; di_++) {
        const int D = dims[di_], window = D == 256 ? 512 : 0;
        for (int sd = 0; sd < n_sides; sd++) {
            use_side(sd);
            bufs[sd].pool = make_pool(D, n_blocks);
        }
        use_side(0);
        printf("\nhead dim %d, %s\n", D, window ? "sliding window 512" : "no window");
        bad += bench_prefill(bufs[0].pool, n_blocks, perm, D, window, iters);
        const char *pf_only = getenv("BENCH_PREFILL_ONLY");
        printf("  seqs    ctx | A eager us  graph us   GB/s | B eager us  graph us | B/A graph | K/V MB | max|A-B|\n");
        for (int si = 0; si < 4 && !(pf_only && strcmp(pf_only, "1") == 0); si++) {
            for (int ci = 0; ci < 3; ci++) {
                const int n = seqs_list[si], ctx = ctx_list[ci], bt_w = ctx / BLOCK;
                const int visible = window > 0 && window < ctx ? window : ctx;
                const double bytes = (double)n * visible * (2.0 * D) * 2.0;
                double te[2] = {0.0, 0.0}, tg[2] = {0.0, 0.0};
                int nonfinite = 0;
                for (int sd = 0; sd < n_sides; sd++) {
                    use_side(sd);
                    const struct side_bufs *b = &bufs[sd];
                    for (int s = 0; s < n; s++)
                        host_i[s] = ctx - 1;
                    upload(b->pos, 0, host_i, 4u * (uint64_t)n);
                    for (int s = 0; s < n; s++)
                        host_i[s] = ctx;
                    upload(b->kv, 0, host_i, 4u * (uint64_t)n);
                    for (int s = 0; s < n; s++)
                        for (int k = 0; k < bt_w; k++)
                            host_i[s * bt_w + k] = perm[s * (MAX_CTX / BLOCK) + k];
                    upload(b->bt, 0, host_i, 4u * (uint64_t)n * (uint64_t)bt_w);
                    const berth_attention_params p = decode_params(b, D, window, n, ctx, bt_w, n_blocks);
                    te[sd] = run_eager(&p, iters);
                    tg[sd] = run_graph(&p);
                    check(vt->buffer_download(be, st, b->o, 0, host_o[sd], sizeof(float) * (uint64_t)D * N_HEADS * n),
                          "buffer_download");
                    check(vt->stream_sync(be, st), "stream_sync");
                    for (int i = 0; i < D * N_HEADS * n; i++)
                        nonfinite += !isfinite(host_o[sd][i]);
                }
                double maxdiff = 0.0;
                for (int i = 0; n_sides > 1 && i < D * N_HEADS * n; i++) {
                    const double df = fabs((double)host_o[0][i] - (double)host_o[1][i]);
                    maxdiff = df > maxdiff || df != df ? df : maxdiff;
                }
                const int mismatch = n_sides > 1 && !(maxdiff <= 1e-4);
                bad += nonfinite + mismatch;
                if (n_sides > 1)
                    printf("  %4d %6d | %10.2f %9.2f %6.0f | %10.2f %9.2f | %9.2f | %6.2f | %.2g%s%s\n", n, ctx,
                           te[0] * 1e6, tg[0] * 1e6, bytes / tg[0] * 1e-9, te[1] * 1e6, tg[1] * 1e6, tg[1] / tg[0],
                           bytes / 1e6, maxdiff, nonfinite ? "  NON-FINITE OUTPUT" : "", mismatch ? "  MISMATCH" : "");
                else
                    printf("  %4d %6d | %10.2f %9.2f %6.0f |          -         - |         - | %6.2f | -%s\n", n,
                           ctx, te[0] * 1e6, tg[0] * 1e6, bytes / tg[0] * 1e-9, bytes / 1e6,
                           nonfinite ? "  NON-FINITE OUTPUT" : "");
                fflush(stdout);
            }
        }
        for (int sd = 0; sd < n_sides; sd++) {
            use_side(sd);
            vt->buffer_free(be, bufs[sd].pool);
        }
    }
    for (int sd = 0; sd < n_sides; sd++) {
        use_side(sd);
        const struct side_bufs *b = &bufs[sd];
        vt->buffer_free(be, b->q);
        vt->buffer_free(be, b->o);
        vt->buffer_free(be, b->pos);
        vt->buffer_free(be, b->qs);
        vt->buffer_free(be, b->kv);
        vt->buffer_free(be, b->bt);
        vt->stream_destroy(be, st);
        vt->destroy(be);
    }
    free(perm);
    free(host_i);
    free(host_q);
    free(host_o[0]);
    free(host_o[1]);
    return bad ? 1 : 0;
}

/*
 * bench_cuda_ops.c — the CUDA backend's decode-path ops at Gemma 4 E2B shapes, timed the way the model runs them:
 * recorded into a CUDA graph (graph_begin / graph_end) and replayed, on one stream.
 *
 * Sections (BENCH_ONLY=gemv|gemv1|skinny|rms|layer|prefill runs one; gemv includes gemv1):
 *   gemv    M = 1, 8, 16 and 32, bf16 weights, the E2B decode (K, N) list: us per call, GB/s of weight bytes,
 *           % of the bandwidth floor, and the largest error of a sample of outputs against a double-precision host
 *           reference (atol 1e-5 sqrt(K), rtol 1e-5, as tests/cuda_ops; M > 8 in bf16 mode: atol 6e-3 sqrt(K));
 *   gemv1   M = 1 at the E2B decode products as the model issues them (fused qkv and gate|up with the GELU
 *           epilogue, the PLE gate with its multiply) on three backends started with BERTH_CUDA_GEMV = new, async
 *           and old, side by side (us, GB/s, each result checked against a host reference), then one decode step's
 *           total per mode (each product times its launches per step);
 *   skinny  the E2B decode products (as gemv1, plus qkv with the RMS-norm prologue) at M = 8, 16, 32, 64 (or
 *           only BENCH_SKINNY_M, for profilers) on two backends started with BERTH_CUDA_SKINNY = 0 (the GEMV at
 *           M <= 8, cuBLAS above) and 2 (matmul_skinny.cu from M = 2), side by side: us, GB/s, each result checked; one decode step's products per M;
 *   rms     rms_norm at the decode shapes (1 x 1536, 8 x 256, 8 x 512, 35 x 256) and a 2048 x 1536 prefill: us;
 *   layer   a Gemma-4-like sliding decoder layer (~20 ops: norms, 9 matmuls, rope, kv_append, attention over 256
 *           cached tokens, GELU gates, residual norms) x 35 layers with distinct weights: us per layer against
 *           the floor of its weight bytes; then a check that programmatic dependent launch changes no bit: the
 *           same 4 layers on a second backend with BERTH_CUDA_PDL=0, outputs and KV cache compared bytewise;
 *   prefill M = 2048 matmuls (cuBLAS; tensor cores in bf16 compute mode): TFLOP/s.
 * Weights live in BERTH_USAGE_WEIGHTS buffers larger than the L2 cache, and consecutive calls read different
 * copies, so the decode figures are DRAM figures, as in the model. Consecutive ops are recorded back to back, so
 * with PDL one op's launch and weight loads overlap the previous op, as in a decode step.
 *
 * Environment: BERTH_CUDA_PDL=0 (read by the plugin) launches without PDL; BENCH_COMPUTE=fp32 runs the plugin in
 * fp32 compute mode (default bf16); BENCH_PEAK_GBS is the bandwidth of "% of floor" (default 4260, the H200 figure
 * of the decode floor); BENCH_ATTN=0 leaves attention out of the layer; BERTH_CUDA_SKINNY (read by the plugin;
 * default: M >= 5) decides whether the gemv section's M = 8 / 16 / 32 rows run on matmul_skinny.cu's kernel.
 * Usage: bench_cuda_ops [berth-backend-cuda.so]. Exit 1 on a wrong result or a failed op, 77 without a device.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <berth/backend.h>

#ifndef CUDA_PLUGIN_PATH
#define CUDA_PLUGIN_PATH "plugins/berth-backend-cuda.so"
#endif

#define PATTERN_BYTES ((uint64_t)64 << 20) /* weight buffers repeat a 64 MiB random pattern */
#define POOL_BYTES ((uint64_t)1 << 30)     /* gemv / prefill weight pool: 1 GiB, 20x the H200's L2 */
#define ALIGN 256

/* ---- a minimal host ---------------------------------------------------------------------------------------- */

static char last_error[512];
static const char *compute_mode = "bf16";

static void h_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx;
    if (level <= BERTH_LOG_INFO)
        fprintf(stderr, "cuda: %s\n", msg);
}

static void h_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    (void)code;
    snprintf(last_error, sizeof last_error, "%s", msg);
}

static const char *h_config_get(berth_host_ctx *ctx, const char *key)
{
    (void)ctx;
    return strcmp(key, "compute") == 0 ? compute_mode : NULL;
}

static berth_status h_config_at(berth_host_ctx *ctx, int32_t idx, const char **key, const char **value)
{
    (void)ctx;
    (void)idx;
    *key = *value = NULL;
    return BERTH_E_NOT_FOUND;
}

static berth_host host;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("bench_cuda_ops: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void check(berth_status st, const char *what)
{
    if (st != BERTH_OK)
        die("%s failed (status %d): %s", what, (int)st, last_error);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double env_double(const char *name, double dflt)
{
    const char *v = getenv(name);
    return v && *v ? atof(v) : dflt;
}

/* ---- one backend (device 0) and its stream ------------------------------------------------------------------ */

struct dev {
    const berth_backend_vtable *vt;
    const berth_ops *ops;
    berth_backend *be;
    berth_stream *s;
};

static const berth_backend_vtable *plugin_vt;

static void dev_open(struct dev *d)
{
    d->vt = plugin_vt;
    check(d->vt->init(&host, 0, &d->be), "init");
    d->ops = d->vt->get_ops(d->be);
    check(d->vt->stream_create(d->be, &d->s), "stream_create");
}

static void dev_close(struct dev *d)
{
    d->vt->stream_destroy(d->be, d->s);
    d->vt->destroy(d->be);
}

static berth_buffer *dev_alloc(struct dev *d, uint64_t bytes, int32_t usage)
{
    berth_buffer *b = NULL;
    check(d->vt->buffer_alloc(d->be, bytes, usage, &b), "buffer_alloc");
    return b;
}

static void dev_upload(struct dev *d, berth_buffer *b, uint64_t off, const void *src, uint64_t n)
{
    check(d->vt->buffer_upload(d->be, d->s, b, off, src, n), "buffer_upload");
}

static void dev_sync(struct dev *d)
{
    check(d->vt->stream_sync(d->be, d->s), "stream_sync");
}

/* ---- data --------------------------------------------------------------------------------------------------- */

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint64_t rand_u64(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rand_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rand_u64() >> 11) * 0x1.0p-53);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* PATTERN_BYTES of bf16 values uniform in [lo, hi). Caller frees. */
static uint16_t *make_pattern(float lo, float hi)
{
    uint16_t *p = malloc(PATTERN_BYTES);
    if (!p)
        die("out of host memory");
    for (uint64_t i = 0; i < PATTERN_BYTES / 2; i++)
        p[i] = f32_to_bf16(rand_uniform(lo, hi));
    return p;
}

/* Bytes [off, off + n) of b: byte o of the buffer gets byte o % PATTERN_BYTES of the pattern. */
static void fill_pattern(struct dev *d, berth_buffer *b, uint64_t off, uint64_t n, const uint16_t *pat)
{
    while (n > 0) {
        const uint64_t in = off % PATTERN_BYTES, len = n < PATTERN_BYTES - in ? n : PATTERN_BYTES - in;
        dev_upload(d, b, off, (const char *)pat + in, len);
        off += len;
        n -= len;
    }
}

static float pattern_at(const uint16_t *pat, uint64_t byte_off)
{
    return bf16_to_f32(pat[(byte_off % PATTERN_BYTES) / 2]);
}

/* n floats uniform in [lo, hi) uploaded to b at off; the host copy is returned (caller frees). */
static float *upload_random_f32(struct dev *d, berth_buffer *b, uint64_t off, uint64_t n, float lo, float hi)
{
    float *h = malloc(n * sizeof(float));
    if (!h)
        die("out of host memory");
    for (uint64_t i = 0; i < n; i++)
        h[i] = rand_uniform(lo, hi);
    dev_upload(d, b, off, h, n * sizeof(float));
    return h;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

static berth_tensor tens(berth_buffer *b, uint64_t off, berth_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    const int64_t es = dt == BERTH_DTYPE_BF16 || dt == BERTH_DTYPE_F16 ? 2 : 4;
    t.buf = b;
    t.offset = off;
    t.dtype = dt;
    t.ndim = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = ne2;
    t.ne[3] = 1;
    t.nb[0] = es;
    t.nb[1] = es * ne0;
    t.nb[2] = t.nb[1] * ne1;
    t.nb[3] = t.nb[2] * ne2;
    return t;
}

/* ---- timing through a graph ---------------------------------------------------------------------------------- */

typedef void (*enqueue_fn)(struct dev *d, void *ctx, int i);

/* Seconds per item: items 0..n-1 (each enqueues ops) are run once directly (workspaces are sized outside the
 * capture, errors surface there), then recorded into one graph, which is replayed (one warm-up replay, then
 * enough replays for ~0.2 s). */
static double graph_time(struct dev *d, enqueue_fn fn, void *ctx, int n)
{
    for (int i = 0; i < n; i++)
        fn(d, ctx, i);
    dev_sync(d);
    check(d->vt->graph_begin(d->be, d->s), "graph_begin");
    for (int i = 0; i < n; i++)
        fn(d, ctx, i);
    berth_graph *g = NULL;
    check(d->vt->graph_end(d->be, d->s, &g), "graph_end");
    check(d->vt->graph_launch(d->be, d->s, g), "graph_launch");
    dev_sync(d);
    double t0 = now();
    check(d->vt->graph_launch(d->be, d->s, g), "graph_launch");
    dev_sync(d);
    const double one = now() - t0;
    int reps = (int)(0.2 / (one > 1e-6 ? one : 1e-6));
    reps = reps < 3 ? 3 : reps > 10000 ? 10000 : reps;
    t0 = now();
    for (int r = 0; r < reps; r++)
        check(d->vt->graph_launch(d->be, d->s, g), "graph_launch");
    dev_sync(d);
    const double t = now() - t0;
    d->vt->graph_destroy(d->be, g);
    return t / ((double)reps * (double)n);
}

/* ---- gemv ---------------------------------------------------------------------------------------------------- */

struct mm_ctx {
    berth_buffer *pool, *x, *y;
    uint64_t stride; /* bytes between weight copies in the pool */
    int copies;
    int64_t M, K, N;
};

static void mm_enqueue(struct dev *d, void *vctx, int i)
{
    const struct mm_ctx *c = vctx;
    berth_matmul_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.w = tens(c->pool, (uint64_t)(i % c->copies) * c->stride, BERTH_DTYPE_BF16, c->K, c->N, 1);
    p.x = tens(c->x, 0, BERTH_DTYPE_F32, c->K, c->M, 1);
    p.y = tens(c->y, 0, BERTH_DTYPE_F32, c->N, c->M, 1);
    check(d->ops->matmul(d->be, d->s, &p), "matmul");
}

static int failures;

/* Whether the plugin (environment as it is now) sends an M-row product of bf16 weights to matmul_skinny.cu, which
 * rounds x to bf16: BERTH_CUDA_SKINNY as cuda_backend.cu reads it (unset / 1: M >= 5; 0: never; 2..64: M >= it). */
static bool skinny_rounds(int64_t M)
{
    if (strcmp(compute_mode, "bf16") != 0 || M > 64)
        return false;
    const char *e = getenv("BERTH_CUDA_SKINNY");
    long lo = 5;
    if (e && *e && strcmp(e, "1") != 0) {
        char *end = NULL;
        const long v = strtol(e, &end, 10);
        if (end != e && *end == '\0' && (v == 0 || (v >= 2 && v <= 64)))
            lo = v;
    }
    return lo > 0 && M >= lo;
}

/* y of copy 0 against the host reference on a sample of columns (all M rows). */
static double mm_verify(struct dev *d, struct mm_ctx *c, const float *x, const uint16_t *pat)
{
    mm_enqueue(d, c, 0);
    float *y = malloc((size_t)(c->M * c->N) * sizeof(float));
    if (!y)
        die("out of host memory");
    check(d->vt->buffer_download(d->be, d->s, c->y, 0, y, (uint64_t)(c->M * c->N) * sizeof(float)),
          "buffer_download");
    dev_sync(d);
    int64_t cols[24];
    int nc = 0;
    cols[nc++] = 0;
    cols[nc++] = c->N - 1;
    cols[nc++] = c->N / 2;
    cols[nc++] = c->N / 3 + 1;
    while (nc < 24)
        cols[nc++] = (int64_t)(rand_u64() % (uint64_t)c->N);
    double worst = 0.0;
    /* M > 8 in bf16 compute mode, and M in the skinny kernel's range, round x to bf16 (tensor cores): the tests'
     * bf16 bound, atol 6e-3 sqrt(K) */
    const bool tc = (c->M > 8 && strcmp(compute_mode, "bf16") == 0) || skinny_rounds(c->M);
    const double atol = (tc ? 6e-3 : 1e-5) * sqrt((double)c->K), rtol = tc ? 0.0 : 1e-5;
    for (int j = 0; j < nc; j++)
        for (int64_t m = 0; m < c->M; m++) {
            const int64_t n = cols[j];
            double ref = 0.0;
            for (int64_t k = 0; k < c->K; k++)
                ref += (double)x[m * c->K + k] * (double)pattern_at(pat, (uint64_t)(n * c->K + k) * 2);
            const double got = y[m * c->N + n], err = fabs(got - ref);
            if (!(err <= atol + rtol * fabs(ref))) {
                if (failures++ < 10)
                    fprintf(stderr, "  WRONG: M=%" PRId64 " K=%" PRId64 " N=%" PRId64 ": y[%" PRId64 ", %" PRId64
                                    "] = %.9g, reference %.9g\n",
                            c->M, c->K, c->N, m, n, got, ref);
            }
            worst = err > worst || err != err ? err : worst;
        }
    free(y);
    return worst;
}

static void bench_gemv(struct dev *d, double peak_gbs)
{
    static const int64_t shapes[][2] = {/* (K, N) */
                                        {1536, 2048},  {1536, 4096},  {1536, 256},  {1536, 512},  {1536, 6144},
                                        {1536, 12288}, {6144, 1536},  {12288, 1536}, {2048, 1536}, {4096, 1536},
                                        {1536, 262144}, {256, 1536},  {1536, 8960}};
    const int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    printf("\n== gemv: bf16 weights, fp32 x / y; graph of back-to-back calls, each on another weight copy ==\n");
    uint16_t *pat = make_pattern(-1.0f, 1.0f);
    berth_buffer *pool = dev_alloc(d, POOL_BYTES, BERTH_USAGE_WEIGHTS);
    fill_pattern(d, pool, 0, POOL_BYTES, pat);
    berth_buffer *x = dev_alloc(d, 32 * 12288 * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    berth_buffer *y = dev_alloc(d, 32 * 262144 * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    float *xh = upload_random_f32(d, x, 0, 32 * 12288, -1.0f, 1.0f);
    /* M = 16, 32: batched decode (cuBLAS, or matmul_skinny.cu with BERTH_CUDA_SKINNY=1 in bf16 compute mode) */
    static const int64_t Ms[] = {1, 8, 16, 32};
    for (int mi = 0; mi < (int)(sizeof Ms / sizeof Ms[0]); mi++) {
        double sum_t = 0.0, sum_bytes = 0.0;
        for (int si = 0; si < n_shapes; si++) {
            struct mm_ctx c = {.pool = pool, .x = x, .y = y, .M = Ms[mi], .K = shapes[si][0], .N = shapes[si][1]};
            const uint64_t bytes = (uint64_t)(c.K * c.N) * 2;
            c.stride = round_up(bytes, ALIGN);
            c.copies = (int)(POOL_BYTES / c.stride);
            int calls = (int)(((uint64_t)2 << 30) / bytes); /* ~2 GiB of weights per replay */
            calls = calls < 4 ? 4 : calls > 200 ? 200 : calls;
            const double err = mm_verify(d, &c, xh, pat);
            const double t = graph_time(d, mm_enqueue, &c, calls);
            const double gbs = (double)bytes / t * 1e-9;
            printf("  M=%" PRId64 " K=%6" PRId64 " N=%6" PRId64 " %7.1f MB: %8.2f us/call %7.0f GB/s %4.0f%% of "
                   "floor (%7.2f us)  max err %.2g\n",
                   c.M, c.K, c.N, (double)bytes / 1e6, t * 1e6, gbs, 100.0 * gbs / peak_gbs,
                   (double)bytes / (peak_gbs * 1e9) * 1e6, err);
            if (c.N != 262144) { /* the layer shapes, without the LM head */
                sum_t += t;
                sum_bytes += (double)bytes;
            }
        }
        printf("  M=%" PRId64 " all shapes but the LM head: %.1f us for %.1f MB = %.0f GB/s\n", Ms[mi], sum_t * 1e6,
               sum_bytes / 1e6, sum_bytes / sum_t * 1e-9);
    }
    free(xh);
    free(pat);
    d->vt->buffer_free(d->be, pool);
    d->vt->buffer_free(d->be, x);
    d->vt->buffer_free(d->be, y);
}

/* ---- gemv at the E2B batch-1 shapes: gemv.cu against matmul.cu's general kernel ------------------------------- */

/* One M = 1 product of a decode step: (K, rows of w), the gated epilogue, launches per step (E2B: 35 layers, 20 of
 * them KV-shared with the double-wide MLP, 7 full-attention layers, 4 of those shared). */
struct e2b_shape {
    const char *name;
    int64_t K, rows;
    int glu;
    int per_step;
};

static const struct e2b_shape e2b_shapes[] = {
    {"q (shared sliding)", 1536, 2048, BERTH_GLU_NONE, 16},
    {"q (shared full)", 1536, 4096, BERTH_GLU_NONE, 4},
    {"qkv (sliding)", 1536, 2560, BERTH_GLU_NONE, 12},
    {"qkv (full)", 1536, 5120, BERTH_GLU_NONE, 3},
    {"o (sliding)", 2048, 1536, BERTH_GLU_NONE, 28},
    {"o (full)", 4096, 1536, BERTH_GLU_NONE, 7},
    {"gate|up 2x6144 + GELU", 1536, 12288, BERTH_GLU_HALVES, 15},
    {"gate|up 2x12288 + GELU", 1536, 24576, BERTH_GLU_HALVES, 20},
    {"down 6144", 6144, 1536, BERTH_GLU_NONE, 15},
    {"down 12288", 12288, 1536, BERTH_GLU_NONE, 20},
    {"PLE gate + GELU*u", 1536, 256, BERTH_GLU_MUL, 35},
    {"PLE proj", 256, 1536, BERTH_GLU_NONE, 35},
    {"PLE model proj", 1536, 8960, BERTH_GLU_NONE, 1},
    {"LM head", 1536, 262144, BERTH_GLU_NONE, 0}, /* its own forward in the runner: listed apart */
};
#define N_E2B_SHAPES ((int)(sizeof e2b_shapes / sizeof e2b_shapes[0]))

struct gv_ctx {
    berth_buffer *pool, *x, *y, *u;
    uint64_t stride;
    int copies;
    int64_t K, rows, N; /* N outputs (rows / 2 with HALVES) */
    int glu;
};

static void gv_enqueue(struct dev *d, void *vctx, int i)
{
    const struct gv_ctx *c = vctx;
    berth_matmul_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.w = tens(c->pool, (uint64_t)(i % c->copies) * c->stride, BERTH_DTYPE_BF16, c->K, c->rows, 1);
    p.x = tens(c->x, 0, BERTH_DTYPE_F32, c->K, 1, 1);
    p.y = tens(c->y, 0, BERTH_DTYPE_F32, c->N, 1, 1);
    p.y_glu = c->glu;
    if (c->glu != BERTH_GLU_NONE)
        p.y_glu_act = BERTH_ACT_GELU_TANH;
    if (c->glu == BERTH_GLU_MUL)
        p.y_glu_up = tens(c->u, 0, BERTH_DTYPE_F32, c->N, 1, 1);
    check(d->ops->matmul(d->be, d->s, &p), "matmul");
}

static double gelu_tanh(double v)
{
    return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

/* y of copy 0 against a double-precision host reference (the epilogue included) on a sample of outputs. */
static double gv_verify(struct dev *d, struct gv_ctx *c, const float *x, const float *u, const uint16_t *pat)
{
    gv_enqueue(d, c, 0);
    float *y = malloc((size_t)c->N * sizeof(float));
    if (!y)
        die("out of host memory");
    check(d->vt->buffer_download(d->be, d->s, c->y, 0, y, (uint64_t)c->N * sizeof(float)), "buffer_download");
    dev_sync(d);
    double worst = 0.0;
    for (int j = 0; j < 24; j++) {
        const int64_t n = j == 0 ? 0 : j == 1 ? c->N - 1 : (int64_t)(rand_u64() % (uint64_t)c->N);
        double z = 0.0, zu = 0.0;
        for (int64_t k = 0; k < c->K; k++) {
            z += (double)x[k] * (double)pattern_at(pat, (uint64_t)(n * c->K + k) * 2);
            if (c->glu == BERTH_GLU_HALVES)
                zu += (double)x[k] * (double)pattern_at(pat, (uint64_t)((c->N + n) * c->K + k) * 2);
        }
        const double ref = c->glu == BERTH_GLU_HALVES ? gelu_tanh(z) * zu
                           : c->glu == BERTH_GLU_MUL  ? gelu_tanh(z) * (double)u[n]
                                                      : z;
        /* the tests' bounds: 1e-5 sqrt(K) (+ rtol 1e-5) for a product, 2e-5 K for an epilogue's */
        const double atol = c->glu == BERTH_GLU_NONE ? 1e-5 * sqrt((double)c->K) : 2e-5 * (double)c->K;
        const double err = fabs((double)y[n] - ref);
        if (!(err <= atol + 1e-5 * fabs(ref))) {
            if (failures++ < 10)
                fprintf(stderr,
                        "  WRONG: K=%" PRId64 " rows=%" PRId64 " glu %d: y[%" PRId64 "] = %.9g, reference %.9g\n",
                        c->K, c->rows, c->glu, n, (double)y[n], ref);
        }
        worst = err > worst || err != err ? err : worst;
    }
    free(y);
    return worst;
}

struct gv_side {
    struct dev d;
    berth_buffer *pool, *x, *y, *u;
};

/* A backend started with BERTH_CUDA_GEMV=mode (the environment is restored after), with its own weight pool. */
static void gv_side_open(struct gv_side *g, const char *mode, const uint16_t *pat, const float *xh, const float *uh)
{
    char saved[64];
    const char *was = getenv("BERTH_CUDA_GEMV");
    if (was)
        snprintf(saved, sizeof saved, "%s", was);
    setenv("BERTH_CUDA_GEMV", mode, 1); /* read by the plugin when the backend starts, just below */
    dev_open(&g->d);
    if (was)
        setenv("BERTH_CUDA_GEMV", saved, 1);
    else
        unsetenv("BERTH_CUDA_GEMV");
    g->pool = dev_alloc(&g->d, POOL_BYTES, BERTH_USAGE_WEIGHTS);
    fill_pattern(&g->d, g->pool, 0, POOL_BYTES, pat);
    g->x = dev_alloc(&g->d, 12288 * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    g->y = dev_alloc(&g->d, 262144 * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    g->u = dev_alloc(&g->d, 262144 * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    dev_upload(&g->d, g->x, 0, xh, 12288 * sizeof(float));
    dev_upload(&g->d, g->u, 0, uh, 262144 * sizeof(float));
    dev_sync(&g->d);
}

static void gv_side_close(struct gv_side *g)
{
    g->d.vt->buffer_free(g->d.be, g->pool);
    g->d.vt->buffer_free(g->d.be, g->x);
    g->d.vt->buffer_free(g->d.be, g->y);
    g->d.vt->buffer_free(g->d.be, g->u);
    dev_close(&g->d);
}

/* us per call of shape e on side g (after checking its result). */
static double gv_time(struct gv_side *g, const struct e2b_shape *e, const float *xh, const float *uh,
                      const uint16_t *pat, double *err)
{
    struct gv_ctx c = {.pool = g->pool, .x = g->x, .y = g->y, .u = g->u, .K = e->K, .rows = e->rows,
                       .N = e->glu == BERTH_GLU_HALVES ? e->rows / 2 : e->rows, .glu = e->glu};
    const uint64_t bytes = (uint64_t)(c.K * c.rows) * 2;
    c.stride = round_up(bytes, ALIGN);
    c.copies = (int)(POOL_BYTES / c.stride);
    int calls = (int)(((uint64_t)2 << 30) / bytes);
    calls = calls < 4 ? 4 : calls > 200 ? 200 : calls;
    *err = gv_verify(&g->d, &c, xh, uh, pat);
    return graph_time(&g->d, gv_enqueue, &c, calls);
}

/* The batch-1 products of an E2B decode step on three backends, started with BERTH_CUDA_GEMV = new (gemv.cu,
 * loads into registers), async (gemv.cu, cp.async through shared memory) and old (matmul.cu's general GEMV); then
 * one step's total, each product times its launches per step. */
static void bench_gemv_e2b(double peak_gbs)
{
    static const char *const modes[3] = {"new", "async", "old"};
    printf("\n== gemv M = 1 at the E2B decode shapes (bf16 w), one backend per BERTH_CUDA_GEMV mode ==\n");
    uint16_t *pat = make_pattern(-1.0f, 1.0f);
    float *xh = malloc(12288 * sizeof(float)), *uh = malloc(262144 * sizeof(float));
    if (!xh || !uh)
        die("out of host memory");
    for (int i = 0; i < 12288; i++)
        xh[i] = rand_uniform(-1.0f, 1.0f);
    for (int i = 0; i < 262144; i++)
        uh[i] = rand_uniform(-1.0f, 1.0f);
    struct gv_side side[3];
    for (int k = 0; k < 3; k++)
        gv_side_open(&side[k], modes[k], pat, xh, uh);
    double step[3] = {0.0, 0.0, 0.0}, step_bytes = 0.0;
    int launches = 0;
    printf("  %-24s %6s %7s %7s | %8s %6s | %8s %6s | %8s %6s | %s\n", "product", "K", "rows", "MB", "new us", "GB/s",
           "async us", "GB/s", "old us", "GB/s", "max err new / async / old");
    for (int i = 0; i < N_E2B_SHAPES; i++) {
        const struct e2b_shape *e = &e2b_shapes[i];
        const double mb = (double)(e->K * e->rows) * 2.0 / 1e6;
        double t[3], err[3];
        for (int k = 0; k < 3; k++)
            t[k] = gv_time(&side[k], e, xh, uh, pat, &err[k]);
        printf("  %-24s %6" PRId64 " %7" PRId64 " %7.1f | %8.2f %6.0f | %8.2f %6.0f | %8.2f %6.0f | "
               "%.2g / %.2g / %.2g\n",
               e->name, e->K, e->rows, mb, t[0] * 1e6, mb * 1e-3 / t[0], t[1] * 1e6, mb * 1e-3 / t[1], t[2] * 1e6,
               mb * 1e-3 / t[2], err[0], err[1], err[2]);
        for (int k = 0; k < 3; k++)
            step[k] += e->per_step * t[k];
        step_bytes += e->per_step * mb * 1e6;
        launches += e->per_step;
    }
    printf("  one decode step's %d M = 1 products (LM head apart), %.1f MB of weights (floor %.1f us at %.0f GB/s):\n",
           launches, step_bytes / 1e6, step_bytes / (peak_gbs * 1e9) * 1e6, peak_gbs);
    for (int k = 0; k < 3; k++)
        printf("    %-5s %8.1f us = %5.0f GB/s\n", modes[k], step[k] * 1e6, step_bytes / step[k] * 1e-9);
    for (int k = 0; k < 3; k++)
        gv_side_close(&side[k]);
    free(pat);
    free(xh);
    free(uh);
}

/* ---- skinny: batched decode products, matmul_skinny.cu against the GEMV / cuBLAS ---------------------------- */

/* d opened with the environment variable var set to val for the backend's start (restored after). */
static void dev_open_env(struct dev *d, const char *var, const char *val)
{
    char saved[64];
    const char *was = getenv(var);
    if (was)
        snprintf(saved, sizeof saved, "%s", was);
    setenv(var, val, 1); /* read by the plugin when the backend starts, just below */
    dev_open(d);
    if (was)
        setenv(var, saved, 1);
    else
        unsetenv(var);
}

#define SK_BENCH_M 64

struct sk_ctx {
    berth_buffer *pool, *x, *y, *u, *nw;
    uint64_t stride;
    int copies;
    int64_t M, K, rows, N; /* N outputs (rows / 2 with HALVES) */
    int glu, norm;
};

static void sk_enqueue(struct dev *d, void *vctx, int i)
{
    const struct sk_ctx *c = vctx;
    berth_matmul_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.w = tens(c->pool, (uint64_t)(i % c->copies) * c->stride, BERTH_DTYPE_BF16, c->K, c->rows, 1);
    p.x = tens(c->x, 0, BERTH_DTYPE_F32, c->K, c->M, 1);
    p.y = tens(c->y, 0, BERTH_DTYPE_F32, c->N, c->M, 1);
    p.y_glu = c->glu;
    if (c->glu != BERTH_GLU_NONE)
        p.y_glu_act = BERTH_ACT_GELU_TANH;
    if (c->glu == BERTH_GLU_MUL)
        p.y_glu_up = tens(c->u, 0, BERTH_DTYPE_F32, c->N, c->M, 1);
    if (c->norm) {
        p.x_norm_mode = BERTH_NORM_W;
        p.x_norm_eps = 1e-6f;
        p.x_norm_w = tens(c->nw, 0, BERTH_DTYPE_BF16, c->K, 1, 1);
    }
    check(d->ops->matmul(d->be, d->s, &p), "matmul");
}

/* y of copy 0 against a double-precision host reference (prologue and epilogue included) on a sample of columns,
 * all M rows; the tests' bounds: 1e-5 sqrt(K) for fp32 products, 6e-3 sqrt(K) where x is rounded to bf16 (twice
 * that under the prologue), times K / sqrt(K) for an epilogue's product of two sums. */
static double sk_verify(struct dev *d, struct sk_ctx *c, bool rounded, const float *x, const float *u,
                        const float *nw, const uint16_t *pat)
{
    sk_enqueue(d, c, 0);
    float *y = malloc((size_t)(c->M * c->N) * sizeof(float));
    double *rstd = malloc((size_t)c->M * sizeof(double));
    if (!y || !rstd)
        die("out of host memory");
    check(d->vt->buffer_download(d->be, d->s, c->y, 0, y, (uint64_t)(c->M * c->N) * sizeof(float)),
          "buffer_download");
    dev_sync(d);
    for (int64_t m = 0; m < c->M; m++) {
        double ss = 0.0;
        for (int64_t k = 0; k < c->K; k++)
            ss += (double)x[m * c->K + k] * x[m * c->K + k];
        rstd[m] = c->norm ? 1.0 / sqrt(ss / (double)c->K + 1e-6) : 1.0;
    }
    double atol = (rounded ? 6e-3 : 1e-5) * sqrt((double)c->K) * (c->norm ? 2.0 : 1.0);
    if (c->glu != BERTH_GLU_NONE)
        atol *= sqrt((double)c->K);
    const double rtol = rounded ? 0.0 : 1e-5;
    double worst = 0.0;
    for (int j = 0; j < 16; j++) {
        const int64_t n = j == 0 ? 0 : j == 1 ? c->N - 1 : (int64_t)(rand_u64() % (uint64_t)c->N);
        for (int64_t m = 0; m < c->M; m++) {
            double z = 0.0, zu = 0.0;
            for (int64_t k = 0; k < c->K; k++) {
                const double xv = (double)x[m * c->K + k] * rstd[m] * (c->norm ? (double)nw[k] : 1.0);
                z += xv * (double)pattern_at(pat, (uint64_t)(n * c->K + k) * 2);
                if (c->glu == BERTH_GLU_HALVES)
                    zu += xv * (double)pattern_at(pat, (uint64_t)((c->N + n) * c->K + k) * 2);
            }
            const double ref = c->glu == BERTH_GLU_HALVES ? gelu_tanh(z) * zu
                               : c->glu == BERTH_GLU_MUL  ? gelu_tanh(z) * (double)u[m * c->N + n]
                                                          : z;
            const double got = y[m * c->N + n], err = fabs(got - ref);
            if (!(err <= atol + rtol * fabs(ref))) {
                if (failures++ < 10)
                    fprintf(stderr,
                            "  WRONG: M=%" PRId64 " K=%" PRId64 " rows=%" PRId64 " glu %d norm %d: y[%" PRId64
                            ", %" PRId64 "] = %.9g, reference %.9g\n",
                            c->M, c->K, c->rows, c->glu, c->norm, m, n, got, ref);
            }
            worst = err > worst || err != err ? err : worst;
        }
    }
    free(y);
    free(rstd);
    return worst;
}

struct sk_side {
    struct dev d;
    berth_buffer *pool, *x, *y, *u, *nw;
};

static void sk_side_open(struct sk_side *g, const char *mode, const uint16_t *pat, const float *xh, const float *uh,
                         const float *nwh)
{
    dev_open_env(&g->d, "BERTH_CUDA_SKINNY", mode);
    g->pool = dev_alloc(&g->d, POOL_BYTES, BERTH_USAGE_WEIGHTS);
    fill_pattern(&g->d, g->pool, 0, POOL_BYTES, pat);
    const uint64_t xn = (uint64_t)SK_BENCH_M * 12288, yn = (uint64_t)SK_BENCH_M * 262144;
    g->x = dev_alloc(&g->d, xn * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    g->y = dev_alloc(&g->d, yn * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    g->u = dev_alloc(&g->d, yn * sizeof(float), BERTH_USAGE_ACTIVATIONS);
    g->nw = dev_alloc(&g->d, 12288 * 2, BERTH_USAGE_WEIGHTS);
    dev_upload(&g->d, g->x, 0, xh, xn * sizeof(float));
    dev_upload(&g->d, g->u, 0, uh, yn * sizeof(float));
    uint16_t *nb = malloc(12288 * 2);
    if (!nb)
        die("out of host memory");
    for (int i = 0; i < 12288; i++)
        nb[i] = f32_to_bf16(nwh[i]);
    dev_upload(&g->d, g->nw, 0, nb, 12288 * 2);
    dev_sync(&g->d);
    free(nb);
}

static void sk_side_close(struct sk_side *g)
{
    g->d.vt->buffer_free(g->d.be, g->pool);
    g->d.vt->buffer_free(g->d.be, g->x);
    g->d.vt->buffer_free(g->d.be, g->y);
    g->d.vt->buffer_free(g->d.be, g->u);
    g->d.vt->buffer_free(g->d.be, g->nw);
    dev_close(&g->d);
}

/* us per call of an M-row product of shape e (with the norm prologue if norm) on side g, after checking it. */
static double sk_time(struct sk_side *g, const char *mode, int64_t M, const struct e2b_shape *e, int norm,
                      const float *xh, const float *uh, const float *nwh, const uint16_t *pat, double *err)
{
    struct sk_ctx c = {.pool = g->pool, .x = g->x, .y = g->y, .u = g->u, .nw = g->nw, .M = M, .K = e->K,
                       .rows = e->rows, .N = e->glu == BERTH_GLU_HALVES ? e->rows / 2 : e->rows, .glu = e->glu,
                       .norm = norm};
    const uint64_t bytes = (uint64_t)(c.K * c.rows) * 2;
    c.stride = round_up(bytes, ALIGN);
    c.copies = (int)(POOL_BYTES / c.stride);
    int calls = (int)(((uint64_t)2 << 30) / bytes);
    calls = calls < 4 ? 4 : calls > 200 ? 200 : calls;
    /* x is rounded to bf16 by the skinny kernel and by cuBLAS (M > 8), not by the GEMV */
    const bool rounded = strcmp(mode, "0") != 0 || M > 8;
    *err = sk_verify(&g->d, &c, rounded, xh, uh, nwh, pat);
    return graph_time(&g->d, sk_enqueue, &c, calls);
}

/* The E2B decode products (e2b_shapes, plus the fused qkv with the RMS-norm prologue) at M = 8, 16, 32, 64 on two
 * backends: BERTH_CUDA_SKINNY=0 (the GEMV at M <= 8, x gather + cuBLAS + GLU kernel above) and =2 (matmul_skinny.cu
 * for every M >= 2): us, GB/s of weight bytes, each result checked; then one decode step's products per M. */
static void bench_skinny(double peak_gbs)
{
    static const char *const modes[2] = {"0", "2"};
    static const int64_t Ms[] = {8, 16, 32, 64};
    static const struct e2b_shape qkv_norm = {"qkv (sliding) + norm", 1536, 2560, BERTH_GLU_NONE, 0};
    printf("\n== skinny: E2B decode products at M = 8..64 (bf16 w, %s compute), BERTH_CUDA_SKINNY=0 (GEMV / cuBLAS) "
           "against =2 (matmul_skinny.cu) ==\n",
           compute_mode);
    uint16_t *pat = make_pattern(-1.0f, 1.0f);
    const uint64_t xn = (uint64_t)SK_BENCH_M * 12288, yn = (uint64_t)SK_BENCH_M * 262144;
    float *xh = malloc(xn * sizeof(float)), *uh = malloc(yn * sizeof(float)), *nwh = malloc(12288 * sizeof(float));
    if (!xh || !uh || !nwh)
        die("out of host memory");
    for (uint64_t i = 0; i < xn; i++)
        xh[i] = rand_uniform(-1.0f, 1.0f);
    for (uint64_t i = 0; i < yn; i++)
        uh[i] = rand_uniform(-1.0f, 1.0f);
    for (int i = 0; i < 12288; i++)
        nwh[i] = bf16_to_f32(f32_to_bf16(rand_uniform(-1.0f, 1.0f)));
    struct sk_side side[2];
    for (int k = 0; k < 2; k++)
        sk_side_open(&side[k], modes[k], pat, xh, uh, nwh);
    const char *only_m = getenv("BENCH_SKINNY_M"); /* one M of Ms only (profiling runs) */
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
        const int64_t M = Ms[mi];
        if (only_m && *only_m && strtoll(only_m, NULL, 10) != M)
            continue;
        printf("  M=%-3" PRId64 " %-24s %6s %7s %7s | %9s %6s | %9s %6s | %6s | %s\n", M, "product", "K", "rows", "MB",
               M <= 8 ? "gemv us" : "cublas us", "GB/s", "skinny us", "GB/s", "ratio", "max err off / skinny");
        double step[2] = {0.0, 0.0}, step_bytes = 0.0;
        for (int i = 0; i <= N_E2B_SHAPES; i++) {
            const struct e2b_shape *e = i < N_E2B_SHAPES ? &e2b_shapes[i] : &qkv_norm;
            const int norm = i == N_E2B_SHAPES;
            const double mb = (double)(e->K * e->rows) * 2.0 / 1e6;
            double t[2], err[2];
            for (int k = 0; k < 2; k++)
                t[k] = sk_time(&side[k], modes[k], M, e, norm, xh, uh, nwh, pat, &err[k]);
            printf("        %-24s %6" PRId64 " %7" PRId64 " %7.1f | %9.2f %6.0f | %9.2f %6.0f | %5.2fx | %.2g / %.2g\n",
                   e->name, e->K, e->rows, mb, t[0] * 1e6, mb * 1e-3 / t[0], t[1] * 1e6, mb * 1e-3 / t[1],
                   t[0] / t[1], err[0], err[1]);
            for (int k = 0; k < 2; k++)
                step[k] += e->per_step * t[k];
            step_bytes += e->per_step * mb * 1e6;
        }
        printf("  M=%" PRId64 ": one decode step's products (LM head apart), %.1f MB (floor %.1f us): off %.1f us "
               "(%.0f GB/s), skinny %.1f us (%.0f GB/s)\n",
               M, step_bytes / 1e6, step_bytes / (peak_gbs * 1e9) * 1e6, step[0] * 1e6, step_bytes / step[0] * 1e-9,
               step[1] * 1e6, step_bytes / step[1] * 1e-9);
    }
    for (int k = 0; k < 2; k++)
        sk_side_close(&side[k]);
    free(pat);
    free(xh);
    free(uh);
    free(nwh);
}

/* ---- rms_norm ------------------------------------------------------------------------------------------------ */

struct rms_ctx {
    berth_buffer *act, *w;
    int64_t n, rows;
    int32_t resid, inplace;
};

static void rms_enqueue(struct dev *d, void *vctx, int i)
{
    (void)i;
    const struct rms_ctx *c = vctx;
    const uint64_t sz = round_up((uint64_t)(c->n * c->rows) * 4, ALIGN);
    berth_rms_norm_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.weight_mode = BERTH_NORM_W;
    p.resid_mode = c->resid;
    p.eps = 1e-6f;
    p.x = tens(c->act, 0, BERTH_DTYPE_F32, c->n, c->rows, 1);
    p.w = tens(c->w, 0, BERTH_DTYPE_BF16, c->n, 1, 1);
    if (c->resid != BERTH_RESID_NONE)
        p.residual = tens(c->act, sz, BERTH_DTYPE_F32, c->n, c->rows, 1);
    p.y = c->inplace ? p.x : tens(c->act, 2 * sz, BERTH_DTYPE_F32, c->n, c->rows, 1);
    check(d->ops->rms_norm(d->be, d->s, &p), "rms_norm");
}

static void bench_rms(struct dev *d)
{
    static const struct {
        const char *name;
        int64_t n, rows;
        int32_t resid, inplace;
    } cases[] = {
        {"input_layernorm            1 x 1536", 1536, 1, BERTH_RESID_NONE, 0},
        {"post norm + residual       1 x 1536", 1536, 1, BERTH_RESID_ADD_AFTER, 0},
        {"q_norm (in place)          8 x 256 ", 256, 8, BERTH_RESID_NONE, 1},
        {"q_norm (in place)          8 x 512 ", 512, 8, BERTH_RESID_NONE, 1},
        {"ple norm + residual (y=x) 35 x 256 ", 256, 35, BERTH_RESID_ADD_AFTER, 1},
        {"prefill + residual      2048 x 1536", 1536, 2048, BERTH_RESID_ADD_AFTER, 0},
    };
    printf("\n== rms_norm: bf16 weight, graph of 200 back-to-back calls on the same (L2-resident) rows ==\n");
    berth_buffer *act = dev_alloc(d, 3 * round_up(2048 * 1536 * 4, ALIGN), BERTH_USAGE_ACTIVATIONS);
    berth_buffer *w = dev_alloc(d, 1536 * 2, BERTH_USAGE_WEIGHTS);
    uint16_t wh[1536];
    for (int i = 0; i < 1536; i++)
        wh[i] = f32_to_bf16(rand_uniform(0.5f, 1.5f));
    dev_upload(d, w, 0, wh, sizeof wh);
    free(upload_random_f32(d, act, 0, 3 * round_up(2048 * 1536 * 4, ALIGN) / 4, -1.0f, 1.0f));
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        struct rms_ctx c = {.act = act, .w = w, .n = cases[ci].n, .rows = cases[ci].rows,
                            .resid = cases[ci].resid, .inplace = cases[ci].inplace};
        const double t = graph_time(d, rms_enqueue, &c, 200);
        const double bytes = (double)(c.n * c.rows) * 4.0 * (c.resid != BERTH_RESID_NONE ? 3.0 : 2.0);
        printf("  %s: %7.2f us/call  (%6.0f GB/s of rows read + written)\n", cases[ci].name, t * 1e6,
               bytes / t * 1e-9);
    }
    d->vt->buffer_free(d->be, act);
    d->vt->buffer_free(d->be, w);
}

/* ---- a decoder layer ---------------------------------------------------------------------------------------- */

/* Gemma 4 E2B sliding-layer dimensions. */
#define L_D 1536
#define L_H 8
#define L_HD 256
#define L_I 6144
#define L_DP 256
#define L_PAIRS 128
#define L_CTX 256 /* cached tokens attention reads (the new one included) */
#define L_BS 16   /* KV block size */

enum { W_Q, W_K, W_V, W_O, W_GATE, W_UP, W_DOWN, W_PG, W_PP, W_COUNT };
static const int64_t w_shape[W_COUNT][2] = {/* (K, N) */
                                            {L_D, L_H * L_HD}, {L_D, L_HD}, {L_D, L_HD}, {L_H * L_HD, L_D},
                                            {L_D, L_I},        {L_D, L_I},  {L_I, L_D},  {L_D, L_DP},
                                            {L_DP, L_D}};
enum { N_IN, N_Q, N_K, N_POST_ATTN, N_PRE_FF, N_POST_FF, N_PLE_POST, N_COUNT };
static const int64_t n_len[N_COUNT] = {L_D, L_HD, L_HD, L_D, L_D, L_D, L_D};
enum { A_X0, A_X1, A_U, A_A, A_Q, A_K, A_V, A_ATT, A_GATE, A_UP, A_PG, A_PLE, A_COUNT };

struct layers {
    int L, attn;
    berth_buffer *w, *nw, *act, *meta, *kv;
    uint64_t w_off[W_COUNT], w_layer;   /* matrix offsets inside a layer's slice, slice size */
    uint64_t n_off[N_COUNT], n_layer, rope_off;
    uint64_t a_off[A_COUNT], a_bytes;
    uint64_t kv_layer;                  /* bytes of one layer's K + V pool */
};

static uint64_t a_len(const struct layers *ly, int a)
{
    switch (a) {
    case A_Q:
    case A_ATT: return L_H * L_HD;
    case A_K:
    case A_V: return L_HD;
    case A_GATE:
    case A_UP: return L_I;
    case A_PG: return L_DP;
    case A_PLE: return (uint64_t)ly->L * L_DP;
    default: return L_D;
    }
}

/* Buffers for L layers filled from the patterns (weights small: values of order 1 / sqrt(K)), the activations
 * and the KV cache from the bench's random sequence (the same on every device set up in the same order). */
static void layers_build(struct dev *d, struct layers *ly, int L, int attn, const uint16_t *wpat,
                         const uint16_t *npat, const uint16_t *kvpat)
{
    memset(ly, 0, sizeof *ly);
    ly->L = L;
    ly->attn = attn;
    uint64_t o = 0;
    for (int i = 0; i < W_COUNT; i++) {
        ly->w_off[i] = o;
        o += round_up((uint64_t)(w_shape[i][0] * w_shape[i][1]) * 2, ALIGN);
    }
    ly->w_layer = o;
    o = 0;
    for (int i = 0; i < N_COUNT; i++) {
        ly->n_off[i] = o;
        o += round_up((uint64_t)n_len[i] * 2, ALIGN);
    }
    ly->n_layer = o;
    ly->rope_off = o * (uint64_t)L;
    o = 0;
    for (int i = 0; i < A_COUNT; i++) {
        ly->a_off[i] = o;
        o += round_up(a_len(ly, i) * 4, ALIGN);
    }
    ly->a_bytes = o;
    ly->kv_layer = 2 * (uint64_t)(L_CTX / L_BS) * L_BS * L_HD * 2;

    ly->w = dev_alloc(d, ly->w_layer * (uint64_t)L, BERTH_USAGE_WEIGHTS);
    fill_pattern(d, ly->w, 0, ly->w_layer * (uint64_t)L, wpat);
    ly->nw = dev_alloc(d, ly->rope_off + L_PAIRS * 4, BERTH_USAGE_WEIGHTS);
    fill_pattern(d, ly->nw, 0, ly->rope_off, npat);
    float freqs[L_PAIRS];
    for (int j = 0; j < L_PAIRS; j++) /* theta 10000 over head_dim 256 */
        freqs[j] = (float)pow(10000.0, -2.0 * j / (double)L_HD);
    dev_upload(d, ly->nw, ly->rope_off, freqs, sizeof freqs);
    ly->act = dev_alloc(d, ly->a_bytes, BERTH_USAGE_ACTIVATIONS);
    free(upload_random_f32(d, ly->act, 0, ly->a_bytes / 4, -1.0f, 1.0f));
    /* meta (i32): position, slot, seq_q_start[2], seq_kv_len, block_table[L_CTX / L_BS] */
    int32_t meta[6 + L_CTX / L_BS];
    meta[0] = L_CTX - 1;
    meta[1] = L_CTX - 1;
    meta[2] = 0;
    meta[3] = 1;
    meta[4] = L_CTX;
    meta[5] = 0;
    for (int b = 0; b < L_CTX / L_BS; b++)
        meta[6 + b] = b;
    ly->meta = dev_alloc(d, sizeof meta, BERTH_USAGE_ACTIVATIONS);
    dev_upload(d, ly->meta, 0, meta, sizeof meta);
    ly->kv = dev_alloc(d, ly->kv_layer * (uint64_t)L, BERTH_USAGE_KV);
    fill_pattern(d, ly->kv, 0, ly->kv_layer * (uint64_t)L, kvpat);
    dev_sync(d);
}

static void layers_free(struct dev *d, struct layers *ly)
{
    d->vt->buffer_free(d->be, ly->w);
    d->vt->buffer_free(d->be, ly->nw);
    d->vt->buffer_free(d->be, ly->act);
    d->vt->buffer_free(d->be, ly->meta);
    d->vt->buffer_free(d->be, ly->kv);
}

static berth_tensor ly_act(const struct layers *ly, int a, int64_t ne0, int64_t ne1)
{
    return tens(ly->act, ly->a_off[a], BERTH_DTYPE_F32, ne0, ne1, 1);
}

static berth_tensor ly_w(const struct layers *ly, int layer, int i)
{
    return tens(ly->w, (uint64_t)layer * ly->w_layer + ly->w_off[i], BERTH_DTYPE_BF16, w_shape[i][0], w_shape[i][1],
                1);
}

static berth_tensor ly_norm(const struct layers *ly, int layer, int i)
{
    return tens(ly->nw, (uint64_t)layer * ly->n_layer + ly->n_off[i], BERTH_DTYPE_BF16, n_len[i], 1, 1);
}

static berth_tensor ly_meta(const struct layers *ly, int first, int64_t n)
{
    return tens(ly->meta, (uint64_t)first * 4, BERTH_DTYPE_I32, n, 1, 1);
}

static void ly_matmul(struct dev *d, berth_tensor x, berth_tensor w, berth_tensor y)
{
    berth_matmul_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.x = x;
    p.w = w;
    p.y = y;
    check(d->ops->matmul(d->be, d->s, &p), "matmul (layer)");
}

static void ly_rms(struct dev *d, berth_tensor x, berth_tensor w, const berth_tensor *res, berth_tensor y)
{
    berth_rms_norm_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.weight_mode = BERTH_NORM_W;
    p.resid_mode = res ? BERTH_RESID_ADD_AFTER : BERTH_RESID_NONE;
    p.eps = 1e-6f;
    p.x = x;
    p.w = w;
    if (res)
        p.residual = *res;
    p.y = y;
    check(d->ops->rms_norm(d->be, d->s, &p), "rms_norm (layer)");
}

static void ly_geglu(struct dev *d, berth_tensor gate, berth_tensor up)
{
    berth_glu_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.act = BERTH_ACT_GELU_TANH;
    p.gate = gate;
    p.up = up;
    p.y = gate;
    check(d->ops->glu(d->be, d->s, &p), "glu (layer)");
}

static berth_kv_view ly_kv(const struct layers *ly, int layer)
{
    berth_kv_view v;
    memset(&v, 0, sizeof v);
    v.k_buf = v.v_buf = ly->kv;
    v.k_offset = (uint64_t)layer * ly->kv_layer;
    v.v_offset = v.k_offset + ly->kv_layer / 2;
    v.token_stride = v.head_stride = v.v_token_stride = v.v_head_stride = L_HD * 2;
    v.block_stride = (uint64_t)L_BS * v.token_stride;
    v.dtype = BERTH_DTYPE_BF16;
    v.block_size = L_BS;
    v.n_blocks = L_CTX / L_BS;
    v.n_kv_heads = 1;
    v.head_dim = v.head_dim_v = L_HD;
    return v;
}

/* Layer i (residual stream in x[i % 2] on entry: each layer swaps three times). */
static void layer_enqueue(struct dev *d, void *vctx, int i)
{
    const struct layers *ly = vctx;
    int cur = i % 2;
    const berth_tensor u = ly_act(ly, A_U, L_D, 1), a = ly_act(ly, A_A, L_D, 1);
    const berth_tensor q = ly_act(ly, A_Q, L_HD, L_H), q_flat = ly_act(ly, A_Q, L_H * L_HD, 1);
    berth_tensor xin = ly_act(ly, A_X0 + cur, L_D, 1), xout = ly_act(ly, A_X1 - cur, L_D, 1);
    const berth_tensor freqs = tens(ly->nw, ly->rope_off, BERTH_DTYPE_F32, L_PAIRS, 1, 1);

    /* attention block */
    ly_rms(d, xin, ly_norm(ly, i, N_IN), NULL, u);
    ly_matmul(d, u, ly_w(ly, i, W_Q), q_flat);
    ly_rms(d, q, ly_norm(ly, i, N_Q), NULL, q);
    berth_rope_params rp;
    memset(&rp, 0, sizeof rp);
    rp.struct_size = sizeof rp;
    rp.mode = BERTH_ROPE_HALF;
    rp.pair_offset = L_HD / 2;
    rp.n_pairs = L_PAIRS;
    rp.x = rp.y = tens(ly->act, ly->a_off[A_Q], BERTH_DTYPE_F32, L_HD, L_H, 1);
    rp.positions = ly_meta(ly, 0, 1);
    rp.freqs = freqs;
    check(d->ops->rope(d->be, d->s, &rp), "rope (layer)");
    ly_matmul(d, u, ly_w(ly, i, W_K), ly_act(ly, A_K, L_HD, 1));
    ly_matmul(d, u, ly_w(ly, i, W_V), ly_act(ly, A_V, L_HD, 1));
    berth_kv_append_params kp;
    memset(&kp, 0, sizeof kp);
    kp.struct_size = sizeof kp;
    kp.k_norm_mode = BERTH_NORM_W;
    kp.v_norm_mode = BERTH_NORM_UNIT;
    kp.eps = 1e-6f;
    kp.rope_mode = BERTH_ROPE_HALF;
    kp.rope_pair_offset = L_HD / 2;
    kp.rope_n_pairs = L_PAIRS;
    kp.k = tens(ly->act, ly->a_off[A_K], BERTH_DTYPE_F32, L_HD, 1, 1);
    kp.v = tens(ly->act, ly->a_off[A_V], BERTH_DTYPE_F32, L_HD, 1, 1);
    kp.slots = ly_meta(ly, 1, 1);
    kp.k_norm = ly_norm(ly, i, N_K);
    kp.positions = ly_meta(ly, 0, 1);
    kp.rope_freqs = freqs;
    kp.kv = ly_kv(ly, i);
    check(d->ops->kv_append(d->be, d->s, &kp), "kv_append (layer)");
    berth_tensor att_in = q_flat;
    if (ly->attn) {
        berth_attention_params ap;
        memset(&ap, 0, sizeof ap);
        ap.struct_size = sizeof ap;
        ap.mask = BERTH_MASK_CAUSAL;
        ap.window = 512;
        ap.scale = 1.0f;
        ap.n_seqs = 1;
        ap.max_q_len = 1;
        ap.max_kv_len = L_CTX;
        ap.q = q;
        ap.out = ly_act(ly, A_ATT, L_HD, L_H);
        ap.positions = ly_meta(ly, 0, 1);
        ap.seq_q_start = ly_meta(ly, 2, 2);
        ap.seq_kv_len = ly_meta(ly, 4, 1);
        ap.block_table = tens(ly->meta, 6 * 4, BERTH_DTYPE_I32, L_CTX / L_BS, 1, 1);
        ap.kv = ly_kv(ly, i);
        check(d->ops->attention(d->be, d->s, &ap), "attention (layer)");
        att_in = ly_act(ly, A_ATT, L_H * L_HD, 1);
    }
    ly_matmul(d, att_in, ly_w(ly, i, W_O), a);
    ly_rms(d, a, ly_norm(ly, i, N_POST_ATTN), &xin, xout);
    cur = 1 - cur;
    xin = ly_act(ly, A_X0 + cur, L_D, 1);
    xout = ly_act(ly, A_X1 - cur, L_D, 1);

    /* MLP block */
    const berth_tensor gate = ly_act(ly, A_GATE, L_I, 1), up = ly_act(ly, A_UP, L_I, 1);
    ly_rms(d, xin, ly_norm(ly, i, N_PRE_FF), NULL, u);
    ly_matmul(d, u, ly_w(ly, i, W_GATE), gate);
    ly_matmul(d, u, ly_w(ly, i, W_UP), up);
    ly_geglu(d, gate, up);
    ly_matmul(d, gate, ly_w(ly, i, W_DOWN), a);
    ly_rms(d, a, ly_norm(ly, i, N_POST_FF), &xin, xout);
    cur = 1 - cur;
    xin = ly_act(ly, A_X0 + cur, L_D, 1);
    xout = ly_act(ly, A_X1 - cur, L_D, 1);

    /* per-layer input block */
    const berth_tensor pg = ly_act(ly, A_PG, L_DP, 1);
    const berth_tensor ple_i = tens(ly->act, ly->a_off[A_PLE] + (uint64_t)i * L_DP * 4, BERTH_DTYPE_F32, L_DP, 1, 1);
    ly_matmul(d, xin, ly_w(ly, i, W_PG), pg);
    ly_geglu(d, pg, ple_i);
    ly_matmul(d, pg, ly_w(ly, i, W_PP), a);
    ly_rms(d, a, ly_norm(ly, i, N_PLE_POST), &xin, xout);
}

/* The residual stream and the KV cache of a layer set, downloaded (caller frees). */
static unsigned char *layers_state(struct dev *d, const struct layers *ly, uint64_t *bytes)
{
    const uint64_t xb = 2 * round_up(L_D * 4, ALIGN), kvb = ly->kv_layer * (uint64_t)ly->L;
    unsigned char *h = malloc(xb + kvb);
    if (!h)
        die("out of host memory");
    check(d->vt->buffer_download(d->be, d->s, ly->act, ly->a_off[A_X0], h, xb), "buffer_download");
    check(d->vt->buffer_download(d->be, d->s, ly->kv, 0, h + xb, kvb), "buffer_download");
    dev_sync(d);
    *bytes = xb + kvb;
    return h;
}

static void bench_layer(struct dev *d, double peak_gbs)
{
    const int attn = env_double("BENCH_ATTN", 1.0) != 0.0;
    const int ops = 19 + attn; /* see layer_enqueue */
    printf("\n== decoder layer (E2B sliding: D %d, 8 x 256 heads, 1 KV head, MLP %d, PLE %d%s): graph of 35 "
           "layers ==\n",
           L_D, L_I, L_DP, attn ? ", attention over 256 tokens" : ", no attention");
    uint16_t *wpat = make_pattern(-0.03f, 0.03f), *npat = make_pattern(0.5f, 1.5f), *kvpat = make_pattern(-1, 1);
    const uint64_t rng0 = rng;
    struct layers ly;
    layers_build(d, &ly, 35, attn, wpat, npat, kvpat);
    double wbytes = 0.0;
    for (int i = 0; i < W_COUNT; i++)
        wbytes += (double)(w_shape[i][0] * w_shape[i][1]) * 2.0;
    const double t = graph_time(d, layer_enqueue, &ly, 35);
    const double floor_s = wbytes / (peak_gbs * 1e9);
    printf("  %.2f us/layer = %.2f us/op (%d ops); weights %.1f MB/layer: floor %.2f us (%.0f%% of it); 35 layers "
           "%.3f ms\n",
           t * 1e6, t * 1e6 / ops, ops, wbytes / 1e6, floor_s * 1e6, 100.0 * floor_s / t, 35 * t * 1e3);
    layers_free(d, &ly);

    /* The same 4 layers with PDL off on a second backend: every output and cache byte must agree. */
    char pdl_buf[64]; /* BERTH_CUDA_PDL as given (setenv below may free the original string) */
    const char *pdl_env = getenv("BERTH_CUDA_PDL");
    if (pdl_env)
        snprintf(pdl_buf, sizeof pdl_buf, "%s", pdl_env);
    const char *pdl = pdl_env ? pdl_buf : NULL;
    if (pdl && strcmp(pdl, "0") == 0) {
        printf("  PDL check: skipped (BERTH_CUDA_PDL=0 already)\n");
    } else {
        struct dev off;
        setenv("BERTH_CUDA_PDL", "0", 1); /* read by the second backend when it starts, just below */
        dev_open(&off);
        if (pdl)
            setenv("BERTH_CUDA_PDL", pdl, 1);
        else
            unsetenv("BERTH_CUDA_PDL");
        struct layers a, b;
        rng = rng0;
        layers_build(d, &a, 4, attn, wpat, npat, kvpat);
        rng = rng0;
        layers_build(&off, &b, 4, attn, wpat, npat, kvpat);
        layer_enqueue(&off, &b, 0);
        dev_sync(&off);
        layer_enqueue(d, &a, 0);
        for (int i = 1; i < 12; i++) { /* 3 direct passes over the 4 layers */
            layer_enqueue(d, &a, i % 4);
            layer_enqueue(&off, &b, i % 4);
        }
        berth_graph *ga = NULL, *gb = NULL; /* then 5 replays of a graph of the 4 layers */
        check(d->vt->graph_begin(d->be, d->s), "graph_begin");
        for (int i = 0; i < 4; i++)
            layer_enqueue(d, &a, i);
        check(d->vt->graph_end(d->be, d->s, &ga), "graph_end");
        check(off.vt->graph_begin(off.be, off.s), "graph_begin");
        for (int i = 0; i < 4; i++)
            layer_enqueue(&off, &b, i);
        check(off.vt->graph_end(off.be, off.s, &gb), "graph_end");
        for (int rep = 0; rep < 5; rep++) {
            check(d->vt->graph_launch(d->be, d->s, ga), "graph_launch");
            check(off.vt->graph_launch(off.be, off.s, gb), "graph_launch");
        }
        uint64_t na, nb;
        unsigned char *sa = layers_state(d, &a, &na), *sb = layers_state(&off, &b, &nb);
        printf("  PDL check: ");
        uint64_t first = na;
        for (uint64_t k = 0; k < na && k < nb; k++)
            if (sa[k] != sb[k]) {
                first = k;
                break;
            }
        if (na == nb && first == na) {
            printf("4 layers x 8 passes (3 direct, 5 graph replays), PDL on vs off: all %" PRIu64
                   " bytes of residual stream and KV cache equal\n",
                   na);
        } else {
            printf("PDL on and off DIFFER (first differing byte %" PRIu64 " of %" PRIu64 "; if attention is not "
                   "deterministic run with BENCH_ATTN=0)\n",
                   first, na);
            failures++;
        }
        free(sa);
        free(sb);
        d->vt->graph_destroy(d->be, ga);
        off.vt->graph_destroy(off.be, gb);
        layers_free(d, &a);
        layers_free(&off, &b);
        dev_close(&off);
    }
    free(wpat);
    free(npat);
    free(kvpat);
}

/* ---- prefill matmuls ----------------------------------------------------------------------------------------- */

static void bench_prefill(struct dev *d)
{
    static const int64_t shapes[][2] = {{1536, 2048}, {1536, 256},  {2048, 1536},  {1536, 6144},
                                        {6144, 1536}, {1536, 12288}, {12288, 1536}};
    const int64_t M = 2048;
    printf("\n== prefill matmul M = %" PRId64 " (%s compute), graph of 10 calls ==\n", M, compute_mode);
    uint16_t *pat = make_pattern(-1.0f, 1.0f);
    berth_buffer *pool = dev_alloc(d, POOL_BYTES / 4, BERTH_USAGE_WEIGHTS);
    fill_pattern(d, pool, 0, POOL_BYTES / 4, pat);
    berth_buffer *x = dev_alloc(d, (uint64_t)M * 12288 * 4, BERTH_USAGE_ACTIVATIONS);
    berth_buffer *y = dev_alloc(d, (uint64_t)M * 12288 * 4, BERTH_USAGE_ACTIVATIONS);
    free(upload_random_f32(d, x, 0, (uint64_t)M * 12288, -1.0f, 1.0f));
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        struct mm_ctx c = {.pool = pool, .x = x, .y = y, .M = M, .K = shapes[si][0], .N = shapes[si][1]};
        c.stride = round_up((uint64_t)(c.K * c.N) * 2, ALIGN);
        c.copies = (int)(POOL_BYTES / 4 / c.stride);
        const double t = graph_time(d, mm_enqueue, &c, 10);
        printf("  K=%6" PRId64 " N=%6" PRId64 ": %8.1f us/call  %6.1f TFLOP/s\n", c.K, c.N, t * 1e6,
               2.0 * (double)M * (double)c.K * (double)c.N / t * 1e-12);
    }
    free(pat);
    d->vt->buffer_free(d->be, pool);
    d->vt->buffer_free(d->be, x);
    d->vt->buffer_free(d->be, y);
}

/* ---- main ---------------------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *path = argc > 1 ? argv[1] : CUDA_PLUGIN_PATH;
    const char *mode = getenv("BENCH_COMPUTE");
    if (mode && *mode)
        compute_mode = mode;
    const char *only = getenv("BENCH_ONLY");
    const double peak_gbs = env_double("BENCH_PEAK_GBS", 4260.0);

    memset(&host, 0, sizeof host);
    host.struct_size = (uint32_t)BERTH_SIZE_TO(berth_host, config_at);
    host.abi_major = BERTH_ABI_MAJOR;
    host.abi_minor = BERTH_ABI_MINOR;
    host.host_version = "bench_cuda_ops";
    host.services = BERTH_SVC_LOG | BERTH_SVC_CONFIG;
    host.log = h_log;
    host.set_error = h_set_error;
    host.config_get = h_config_get;
    host.config_at = h_config_at;

    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so)
        die("dlopen %s: %s", path, dlerror());
    berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(so, BERTH_PLUGIN_ENTRY_SYMBOL);
    if (!entry)
        die("%s: no %s", path, BERTH_PLUGIN_ENTRY_SYMBOL);
    const berth_plugin_desc *desc = entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    if (!desc || !desc->vtable)
        die("%s: no descriptor", path);
    plugin_vt = (const berth_backend_vtable *)desc->vtable;
    berth_probe_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    check(plugin_vt->probe(&host, &pi), "probe");
    if (pi.n_devices < 1) {
        printf("no CUDA device: %s\n", pi.message);
        return 77;
    }
    struct dev d;
    dev_open(&d);
    const char *pdl = getenv("BERTH_CUDA_PDL");
    printf("bench_cuda_ops: %s, compute %s, PDL %s, floor bandwidth %.0f GB/s\n", path, compute_mode,
           pdl && strcmp(pdl, "0") == 0 ? "off" : "on", peak_gbs);

    if (!only || strcmp(only, "gemv") == 0)
        bench_gemv(&d, peak_gbs);
    if (!only || strcmp(only, "gemv") == 0 || strcmp(only, "gemv1") == 0)
        bench_gemv_e2b(peak_gbs);
    if (!only || strcmp(only, "skinny") == 0)
        bench_skinny(peak_gbs);
    if (!only || strcmp(only, "rms") == 0)
        bench_rms(&d);
    if (!only || strcmp(only, "layer") == 0)
        bench_layer(&d, peak_gbs);
    if (!only || strcmp(only, "prefill") == 0)
        bench_prefill(&d);

    dev_close(&d);
    if (failures) {
        printf("\n%d WRONG results\n", failures);
        return 1;
    }
    return 0;
}

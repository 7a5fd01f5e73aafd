/*
 * bench_cpu_matmul.c — CPU backend matmul throughput against the machine's memory bandwidth.
 *
 * Loads the built CPU plugin (path compiled in, or argv[1]) and measures:
 *   - decode (M = 1): GB/s of weight bytes read, for bf16 and f32 weights of K x N;
 *   - prefill (M = 64): GFLOP/s (2*M*N*K flops per call);
 *   - memcpy bandwidth (bytes read + written) and a read-only sum bandwidth with the same thread count, so the
 *     decode figure can be read as a fraction of what the memory system delivers.
 * Threads: BERTH_THREADS (default 0 = one per core), as the plugin's `threads` key; BERTH_ISA pins the kernels
 * (the plugin's `isa` key: avx512, avx2, generic).
 * Usage: bench_cpu_matmul [plugin.so]
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <berth/backend.h>

#ifndef CPU_PLUGIN_PATH
#define CPU_PLUGIN_PATH "plugins/berth-backend-cpu.so"
#endif

static char threads_value[16] = "0";

static void host_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx;
    if (level <= BERTH_LOG_INFO)
        fprintf(stderr, "cpu: %s\n", msg);
}
static void host_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    fprintf(stderr, "error %d: %s\n", code, msg);
}
static const char *host_config_get(berth_host_ctx *ctx, const char *key)
{
    (void)ctx;
    if (strcmp(key, "isa") == 0)
        return getenv("BERTH_ISA");
    return strcmp(key, "threads") == 0 ? threads_value : NULL;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const berth_backend_vtable *vt;
static const berth_ops *ops;
static berth_backend *be;
static berth_stream *st;

static berth_buffer *alloc_buf(size_t bytes, void **host)
{
    berth_buffer *b;
    if (vt->buffer_alloc(be, bytes, BERTH_USAGE_WEIGHTS, &b) != BERTH_OK)
        exit(1);
    vt->buffer_host_ptr(be, b, host);
    return b;
}

static berth_tensor tensor2(berth_buffer *b, berth_dtype dt, size_t es, int64_t ne0, int64_t ne1)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.buf = b;
    t.dtype = dt;
    t.ndim = 2;
    t.ne[0] = ne0;
    t.ne[1] = ne1;
    t.ne[2] = t.ne[3] = 1;
    t.nb[0] = (int64_t)es;
    t.nb[1] = (int64_t)es * ne0;
    t.nb[2] = t.nb[3] = t.nb[1] * ne1;
    return t;
}

/* Best seconds per call of `iters` matmuls (after one warm-up). */
static double time_matmul(const berth_matmul_params *p, int iters)
{
    ops->matmul(be, st, p);
    double best = 1e30;
    for (int i = 0; i < iters; i++) {
        const double t0 = now();
        if (ops->matmul(be, st, p) != BERTH_OK)
            exit(1);
        const double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    return best;
}

static void bench_matmul(berth_dtype dt, const char *name, int64_t K, int64_t N, double memcpy_gbs, double read_gbs)
{
    const size_t es = dt == BERTH_DTYPE_F32 ? 4 : 2;
    void *wh, *xh, *yh;
    berth_buffer *wb = alloc_buf((size_t)K * (size_t)N * es, &wh);
    berth_buffer *xb = alloc_buf((size_t)K * 64 * 4, &xh);
    berth_buffer *yb = alloc_buf((size_t)N * 64 * 4, &yh);
    unsigned char *w = wh;
    for (size_t i = 0; i < (size_t)K * (size_t)N * es; i += 2) { /* small finite values in any dtype */
        w[i] = (unsigned char)(i * 7);
        w[i + 1] = 0x3c;
    }
    float *x = xh;
    for (int64_t i = 0; i < K * 64; i++)
        x[i] = (float)((i % 13) - 6) * 0.01f;

    berth_matmul_params p = {.struct_size = sizeof p};
    p.w = tensor2(wb, dt, es, K, N);
    p.x = tensor2(xb, BERTH_DTYPE_F32, 4, K, 1);
    p.y = tensor2(yb, BERTH_DTYPE_F32, 4, N, 1);
    const double wbytes = (double)K * (double)N * (double)es;
    const double t1 = time_matmul(&p, 20);
    const double gbs = wbytes / t1 * 1e-9;
    printf("  %-4s %5" PRId64 " x %5" PRId64 " (%4.0f MB)  M=1 : %7.3f ms  %6.1f GB/s weights  = %3.0f%% of memcpy, %3.0f%% of read\n",
           name, N, K, wbytes / 1e6, t1 * 1e3, gbs, 100 * gbs / memcpy_gbs, 100 * gbs / read_gbs);
    p.x.ne[1] = 64;
    p.y.ne[1] = 64;
    const double t64 = time_matmul(&p, 3);
    printf("  %-4s %5" PRId64 " x %5" PRId64 "            M=64: %7.3f ms  %6.1f GFLOP/s\n", name, N, K, t64 * 1e3,
           2.0 * 64 * (double)K * (double)N / t64 * 1e-9);
    vt->buffer_free(be, wb);
    vt->buffer_free(be, xb);
    vt->buffer_free(be, yb);
}

/* ---- memory bandwidth with plain threads ---- */

struct bw_job {
    char *dst;
    const char *src;
    size_t bytes;
    int read_only;
    double sum;
};

static void *bw_worker(void *arg)
{
    struct bw_job *j = arg;
    if (j->read_only) {
        const double *s = (const double *)j->src;
        double a = 0, b = 0, c = 0, d = 0;
        for (size_t i = 0; i + 4 <= j->bytes / 8; i += 4) {
            a += s[i];
            b += s[i + 1];
            c += s[i + 2];
            d += s[i + 3];
        }
        j->sum = a + b + c + d;
    } else {
        memcpy(j->dst, j->src, j->bytes);
    }
    return NULL;
}

/* GB/s over `bytes` split across n threads; memcpy counts bytes read + written. */
static double bandwidth(int n, size_t bytes, int read_only)
{
    char *src = aligned_alloc(64, bytes), *dst = read_only ? NULL : aligned_alloc(64, bytes);
    memset(src, 1, bytes);
    if (dst)
        memset(dst, 0, bytes);
    pthread_t th[1024];
    struct bw_job jobs[1024];
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        const double t0 = now();
        for (int i = 0; i < n; i++) {
            const size_t lo = bytes / (size_t)n * (size_t)i / 64 * 64;
            const size_t hi = i + 1 == n ? bytes : bytes / (size_t)n * (size_t)(i + 1) / 64 * 64;
            jobs[i] = (struct bw_job){.dst = dst ? dst + lo : NULL, .src = src + lo, .bytes = hi - lo,
                                      .read_only = read_only};
            pthread_create(&th[i], NULL, bw_worker, &jobs[i]);
        }
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
        const double dt = now() - t0;
        best = rep > 0 && dt < best ? dt : best; /* first pass faults pages in */
    }
    free(src);
    free(dst);
    return (double)bytes * (read_only ? 1.0 : 2.0) / best * 1e-9;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* interleave with the plugin log on stderr */
    const char *path = argc > 1 ? argv[1] : CPU_PLUGIN_PATH;
    const char *env = getenv("BERTH_THREADS");
    if (env)
        snprintf(threads_value, sizeof threads_value, "%s", env);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    const berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(h, BERTH_PLUGIN_ENTRY_SYMBOL);
    const berth_plugin_desc *desc = entry ? entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR) : NULL;
    if (!desc) {
        fprintf(stderr, "%s: no usable descriptor\n", path);
        return 1;
    }
    static berth_host host = {.struct_size = sizeof(berth_host), .abi_major = BERTH_ABI_MAJOR,
                              .abi_minor = BERTH_ABI_MINOR, .host_version = "bench",
                              .services = BERTH_SVC_LOG | BERTH_SVC_CONFIG, .log = host_log,
                              .set_error = host_set_error, .config_get = host_config_get};
    vt = desc->vtable;
    berth_device_info di = {.struct_size = sizeof di};
    if (vt->device_info(&host, 0, &di) != BERTH_OK || vt->init(&host, 0, &be) != BERTH_OK ||
        vt->stream_create(be, &st) != BERTH_OK)
        return 1;
    ops = vt->get_ops(be);
    printf("device: %s\n", di.name);

    const size_t bw_bytes = (size_t)256 << 20;
    const double mc = bandwidth(di.compute_units, bw_bytes, 0), rd = bandwidth(di.compute_units, bw_bytes, 1);
    printf("memory, %d threads: memcpy %.1f GB/s (read + write), read-only sum %.1f GB/s\n", di.compute_units, mc, rd);
    printf("matmul (weights N x K):\n");
    bench_matmul(BERTH_DTYPE_BF16, "bf16", 4096, 4096, mc, rd);
    bench_matmul(BERTH_DTYPE_F32, "f32", 4096, 4096, mc, rd);
    bench_matmul(BERTH_DTYPE_BF16, "bf16", 4096, 16384, mc, rd); /* 128 MB: well beyond the caches */
    bench_matmul(BERTH_DTYPE_F16, "f16", 4096, 16384, mc, rd);
    vt->stream_destroy(be, st);
    vt->destroy(be);
    return 0;
}

/*
 * sm_stream.cu — how fast a few thread blocks (one per SM) stream bytes from HBM into shared memory.
 *
 * The question behind it: a decode-attention design with one block per sequence (32 blocks at c=32) streams the
 * step's 16.8 MB of K/V through 32 SMs; it pays only if 32 SMs pull ~3 TB/s together (~100 GB/s each). The whole
 * GPU's bandwidth says nothing about that: one SM's rate is bounded by the bytes it keeps in flight over the
 * memory latency (Little's law), and this measures it directly, for a few engines and ring sizes.
 *
 * B blocks (8 .. 264) each stream their own contiguous S bytes (512 KiB and 4 MiB, two tables) through a ring of F
 * bytes of shared memory (32 .. 192 KiB, "bytes in flight per block") in 16 KiB chunks, and xor one 16-byte word
 * per thread of every chunk into a register (--touch all: every word), written out per block at the end. Up to the
 * SM count each block has an SM of its own (the launch asks for more than half an SM's shared memory, so two never
 * share one); beyond it, ceil(B / SMs) share each SM, and a ring that does not fit that many is skipped ("-").
 * The reads come from a 2 GiB buffer at an offset that moves on with every launch (it wraps only after > 1 GB), so
 * none of them is served by the 50 MB L2. Two copy engines:
 *   bulk     1D TMA: one thread of a producer warp issues cp.async.bulk copies of 16 KiB, one per ring stage, each
 *            completing on the stage's "full" mbarrier (armed with arrive.expect_tx); 4 consumer warps wait on it
 *            (try_wait.parity), touch the chunk and arrive (one lane per warp) on the stage's "empty" mbarrier,
 *            which the producer waits on before it refills the stage (warp-specialized; up to F bytes in flight);
 *   cpasync  256 threads, 4 x 16-byte cp.async.cg each per chunk, one commit group per chunk, wait_group and
 *            __syncthreads per chunk (matmul_skinny's ring: F - 16 KiB in flight while a chunk is consumed).
 * Timing: CUDA events around each of --reps launches (after 3 warm-ups), the median; a configuration's launches
 * are all queued behind a 1 ms spin kernel, so they run back to back (the host's launch latency is not in the
 * times, the GPU's is). "floor" is the same kernel streaming no bytes (launch, barrier setup, the end's store),
 * which every time in the table includes: the 512 KiB table is the decode-sized launch, the 4 MiB one comes close
 * to the steady per-block rate.
 *
 *   build/bench/bench_sm_stream [--engine bulk|cpasync|both] [--reps N] [--touch few|all]
 */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>

#define CHUNK 16384          /* bytes per ring stage */
#define MAX_STAGES 12        /* 192 KiB */
#define CONS_WARPS 4         /* bulk: consumer warps, and one producer warp after them */
#define BULK_THREADS ((CONS_WARPS + 1) * 32)
#define CPA_THREADS 256
#define BUF_BYTES ((size_t)2 << 30)
#define WARMUP 3

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        cudaError_t e_ = (x);                                                                                        \
        if (e_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "bench_sm_stream: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);           \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

static __device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* mbarriers (sm_90): count arrivals complete a phase, together with the transaction bytes announced by
 * arrive.expect_tx when the bulk copies signed up on it have landed; waiters spin on the phase's parity. */
static __device__ __forceinline__ void bar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

static __device__ __forceinline__ void bar_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

static __device__ __forceinline__ void bar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/* Returns once the phase of the given parity has completed (acquire: the stage's bytes are visible). */
static __device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nSS_BAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra SS_BAR_WAIT;\n}" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* 1D TMA: bytes (a multiple of 16) global -> shared, completing as transaction bytes on bar. */
static __device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"((uint64_t)__cvta_generic_to_global(src)), "r"(bytes), "r"(bar)
                 : "memory");
}

static __device__ __forceinline__ void cp16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

static __device__ __forceinline__ void cp_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N>
static __device__ __forceinline__ void cp_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* A warp's xor of what it read, into its block's word (so no load can be dropped). */
static __device__ __forceinline__ void finish(uint32_t acc, uint32_t *out)
{
#pragma unroll
    for (int o = 16; o; o >>= 1)
        acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if (threadIdx.x % 32 == 0)
        atomicXor(out + blockIdx.x, acc);
}

/* bulk: block b streams nchunks x 16 KiB from src + b * per_block through ns stages; tv 16-byte words per consumer
 * thread and chunk are read back. */
__global__ void __launch_bounds__(BULK_THREADS)
    bulk_kernel(const char *src, int64_t per_block, int nchunks, int ns, int tv, uint32_t *out)
{
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) uint64_t full[MAX_STAGES], empty[MAX_STAGES];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ns; s++) {
            bar_init(smem_addr(&full[s]), 1);           /* the producer's arrive.expect_tx (+ the bytes) */
            bar_init(smem_addr(&empty[s]), CONS_WARPS); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); /* visible to the async proxy */
    }
    __syncthreads();
    const char *g = src + blockIdx.x * per_block;
    if (warp == CONS_WARPS) { /* producer: use k of stage s waits for the consumers' release of use k-1 */
        if (lane == 0) {
            int s = 0;
            uint32_t ph = 0; /* parity of the stage's current use, k & 1 */
            for (int i = 0; i < nchunks; i++) {
                const uint32_t fb = smem_addr(&full[s]);
                if (i >= ns)
                    bar_wait(smem_addr(&empty[s]), ph ^ 1); /* phase k-1 of empty[s] */
                bar_expect(fb, CHUNK);
                bulk_copy(smem_addr(ring + s * CHUNK), g + (int64_t)i * CHUNK, CHUNK, fb);
                if (++s == ns) {
                    s = 0;
                    ph ^= 1;
                }
            }
        }
        return;
    }
    uint32_t acc = 0, ph = 0;
    int s = 0;
    for (int i = 0; i < nchunks; i++) {
        bar_wait(smem_addr(&full[s]), ph); /* phase k of full[s]: use k's bytes have landed */
        const uint4 *c = (const uint4 *)(ring + s * CHUNK);
        for (int v = 0; v < tv; v++) {
            const uint4 x = c[v * (CONS_WARPS * 32) + threadIdx.x];
            acc ^= x.x ^ x.y ^ x.z ^ x.w;
        }
        __syncwarp(); /* the warp's reads are done before its lane 0 releases the stage */
        if (lane == 0)
            bar_arrive(smem_addr(&empty[s]));
        if (++s == ns) {
            s = 0;
            ph ^= 1;
        }
    }
    finish(acc, out);
}

/* cpasync: the same streaming with every thread's 16-byte cp.async, NS stages, NS - 1 chunks ahead. */
template <int NS>
__global__ void __launch_bounds__(CPA_THREADS)
    cpasync_kernel(const char *src, int64_t per_block, int nchunks, int ns, int tv, uint32_t *out)
{
    (void)ns; /* NS */
    extern __shared__ __align__(128) char ring[];
    const char *g = src + blockIdx.x * per_block;
    const int t = threadIdx.x;
    auto load = [&](int i) {
        const uint32_t d = smem_addr(ring + (i % NS) * CHUNK);
        const char *p = g + (int64_t)i * CHUNK;
#pragma unroll
        for (int j = 0; j < CHUNK / 16 / CPA_THREADS; j++)
            cp16(d + (j * CPA_THREADS + t) * 16, p + (j * CPA_THREADS + t) * 16);
    };
    for (int s = 0; s < NS - 1; s++) {
        if (s < nchunks)
            load(s);
        cp_commit();
    }
    uint32_t acc = 0;
    for (int i = 0; i < nchunks; i++) {
        cp_wait<NS - 2>(); /* this thread's part of chunk i has landed */
        __syncthreads();   /* everyone's; and everyone is done with chunk i - 1, whose stage is refilled now */
        if (i + NS - 1 < nchunks)
            load(i + NS - 1);
        cp_commit();
        const uint4 *c = (const uint4 *)(ring + (i % NS) * CHUNK);
        for (int v = 0; v < tv; v++) {
            const uint4 x = c[v * CPA_THREADS + t];
            acc ^= x.x ^ x.y ^ x.z ^ x.w;
        }
    }
    finish(acc, out);
}

/* Spins for ns nanoseconds: holds the stream while the host queues a configuration's launches behind it. */
__global__ void hold_kernel(int64_t ns)
{
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < (uint64_t)ns);
}

typedef void (*kernel_fn)(const char *, int64_t, int, int, int, uint32_t *);

static kernel_fn kernel_for(bool bulk, int ns)
{
    if (bulk)
        return bulk_kernel;
    switch (ns) {
    case 2: return cpasync_kernel<2>;
    case 4: return cpasync_kernel<4>;
    case 6: return cpasync_kernel<6>;
    case 8: return cpasync_kernel<8>;
    case 12: return cpasync_kernel<12>;
    }
    return nullptr;
}

struct ctx {
    cudaDeviceProp prop;
    char *buf;
    uint32_t *out;
    size_t cursor; /* where the next launch's reads start: never read again before > 1 GB of other reads */
    int reps, touch_all;
    std::vector<cudaEvent_t> e0, e1;
};

/* Median us per launch of B blocks streaming S bytes each through an F-byte ring; < 0 when it does not fit. */
static float measure(ctx &c, bool bulk, int B, int F, int64_t S)
{
    const int ns = F / CHUNK, nsm = c.prop.multiProcessorCount;
    const kernel_fn fn = kernel_for(bulk, ns);
    const int threads = bulk ? BULK_THREADS : CPA_THREADS;
    size_t smem = (size_t)F;
    if (B <= nsm) /* more than half an SM's shared memory: one block per SM */
        smem = std::max(smem, c.prop.sharedMemPerMultiprocessor / 2 + 1024);
    if (!fn || smem > c.prop.sharedMemPerBlockOptin)
        return -1.0f;
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, threads, smem));
    if (occ < (B + nsm - 1) / nsm)
        return -1.0f;
    const int tv = c.touch_all ? CHUNK / 16 / (bulk ? CONS_WARPS * 32 : CPA_THREADS) : 1;
    const size_t bytes = (size_t)B * (size_t)S;
    auto launch = [&]() {
        if (c.cursor + bytes > BUF_BYTES)
            c.cursor = 0;
        fn<<<B, threads, smem>>>(c.buf + c.cursor, S, (int)(S / CHUNK), ns, tv, c.out);
        CK(cudaGetLastError());
        c.cursor += bytes;
    };
    hold_kernel<<<1, 1>>>(1000000); /* everything below is queued before the GPU gets to it */
    CK(cudaGetLastError());
    for (int r = 0; r < WARMUP; r++)
        launch();
    for (int r = 0; r < c.reps; r++) {
        CK(cudaEventRecord(c.e0[r]));
        launch();
        CK(cudaEventRecord(c.e1[r]));
    }
    CK(cudaEventSynchronize(c.e1[c.reps - 1]));
    std::vector<float> t;
    for (int r = 0; r < c.reps; r++) {
        float ms;
        CK(cudaEventElapsedTime(&ms, c.e0[r], c.e1[r]));
        t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char **argv)
{
    int engines = 3; /* bit 0 bulk, bit 1 cpasync */
    ctx c = {};
    c.reps = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_sm_stream: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--engine") && (!strcmp(v, "bulk") || !strcmp(v, "cpasync") || !strcmp(v, "both")))
            engines = !strcmp(v, "bulk") ? 1 : !strcmp(v, "cpasync") ? 2 : 3;
        else if (!strcmp(a, "--reps") && atoi(v) >= 1)
            c.reps = atoi(v);
        else if (!strcmp(a, "--touch") && (!strcmp(v, "few") || !strcmp(v, "all")))
            c.touch_all = !strcmp(v, "all");
        else {
            fprintf(stderr, "bench_sm_stream: bad option %s %s (--engine bulk|cpasync|both, --reps N, "
                            "--touch few|all)\n", a, v);
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_sm_stream: no CUDA device\n");
        return 77;
    }
    CK(cudaGetDeviceProperties(&c.prop, 0));
    if (c.prop.major < 9) {
        fprintf(stderr, "bench_sm_stream: needs sm_90 (cp.async.bulk, mbarrier transactions); %s is sm_%d%d\n",
                c.prop.name, c.prop.major, c.prop.minor);
        return 77;
    }
    const int nsm = c.prop.multiProcessorCount;
    printf("%s, %d SMs, L2 %d MiB, shared memory %zu KiB per SM (%zu KiB per block, opt-in); touch %s, "
           "%d launches per configuration (median, after %d warm-ups)\n",
           c.prop.name, nsm, c.prop.l2CacheSize >> 20, c.prop.sharedMemPerMultiprocessor >> 10,
           c.prop.sharedMemPerBlockOptin >> 10, c.touch_all ? "all" : "few", c.reps, WARMUP);
    CK(cudaMalloc(&c.buf, BUF_BYTES));
    CK(cudaMemset(c.buf, 0x5a, BUF_BYTES));
    CK(cudaMalloc(&c.out, 1024 * sizeof(uint32_t)));
    CK(cudaMemset(c.out, 0, 1024 * sizeof(uint32_t)));
    CK(cudaDeviceSynchronize());
    c.e0.resize(c.reps);
    c.e1.resize(c.reps);
    for (int r = 0; r < c.reps; r++) {
        CK(cudaEventCreate(&c.e0[r]));
        CK(cudaEventCreate(&c.e1[r]));
    }

    const int Bs[] = {8, 16, 32, 64, 132, 264}, Fk[] = {32, 64, 96, 128, 192};
    const int64_t Ss[] = {512 << 10, 4 << 20};
    for (int e = 0; e < 2; e++) {
        if (!(engines >> e & 1))
            continue;
        const bool bulk = e == 0;
        for (int64_t S : Ss) {
            printf("\n%s, S = %lld KiB per block: us per launch, total GB/s, GB/s per block\n",
                   bulk ? "bulk (1D TMA, 16 KiB copies, 1 producer + 4 consumer warps, full/empty mbarriers)"
                        : "cpasync (256 threads x 16-byte cp.async.cg, 16 KiB commit groups)",
                   (long long)(S >> 10));
            printf("   B  floor us");
            for (int f : Fk) {
                char h[16];
                snprintf(h, sizeof h, "F=%dK", f);
                printf(" | %19s", h);
            }
            printf("\n");
            for (int B : Bs) {
                if (B > 2 * nsm)
                    continue;
                const float fl = measure(c, bulk, B, 32 * 1024, 0);
                printf("%4d  %8.1f", B, fl);
                for (int f : Fk) {
                    const float us = measure(c, bulk, B, f * 1024, S);
                    if (us < 0.0f)
                        printf(" | %19s", "-");
                    else {
                        const double gbs = (double)B * (double)S / (us * 1e3);
                        printf(" | %6.1f %6.0f %5.0f", us, gbs, gbs / B);
                    }
                }
                printf("\n");
            }
        }
    }
    CK(cudaDeviceSynchronize());
    uint32_t h[1024];
    CK(cudaMemcpy(h, c.out, sizeof(h), cudaMemcpyDeviceToHost)); /* the kernels' stores, read back */
    uint32_t x = 0;
    for (uint32_t v : h)
        x ^= v;
    printf("\n(xor of the blocks' words, kept so no load is dropped: %08x)\n", x);
    for (int r = 0; r < c.reps; r++) {
        CK(cudaEventDestroy(c.e0[r]));
        CK(cudaEventDestroy(c.e1[r]));
    }
    CK(cudaFree(c.buf));
    CK(cudaFree(c.out));
    return 0;
}

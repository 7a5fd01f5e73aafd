/*
 * boundary_cost.cu — what a kernel boundary costs in a decode step, and what a persistent kernel would save.
 *
 * A synthetic decode step with the byte sizes of Gemma 4 E2B at 32 sequences (bf16 weights, K/V at a mean context
 * of 576 keys): 35 layers x 12 dependent stages (q|k|v, kv_append, attention, merge, o, norm, gate|up, down, norm,
 * PLE gate, PLE projection, norm) + the LM head, 421 stages, ~3.3 GB. Each stage streams its own bytes once
 * (through a ring of cp.async chunks in shared memory, as the products do), and needs the previous stage's output:
 * every block reads a slice of it that spans all of its producers (an all-to-all dependency, as a product's x or a
 * norm's row), and writes its own slice of this stage's output. No arithmetic to speak of: the question is what
 * the chain costs beyond its bytes, not the products' math.
 *
 * The same work three ways, each replayed from a CUDA graph, outputs compared bit for bit:
 *   chain       one kernel per stage, programmatic dependent launch (PDL): each block starts its first ring of
 *               weight loads before griddepcontrol.wait, as berth's kernels do (421 launches);
 *   persistent  one kernel resident on every SM for the whole step: a block finishes its part of stage s, counts
 *               itself in stage s's counter (release), issues stage s+1's first ring of loads and only then waits
 *               for stage s's counter to be complete (acquire) before it reads stage s's output;
 *   persistent-call  the same with each stage's body behind a __noinline__ call (the cost of dispatching task
 *               types as device functions, bench/RESULTS.md session 20);
 * next to the floor: the same bytes as one stream with no dependency at all.
 *
 *   build/bench/bench_boundary_cost [--reps N] [--blocks-per-sm B] [--ring-kb K] [--xread F] [--layers L]
 *                                   [--bytes-scale F] [--nodep 1] [--fence 0] [--pdl 0] [--fanin F]
 *                                   [--tail MASK [--tail-blocks T]] [--fold MASK [--fold-cs C] [--fold-xchg 0]]
 * --bytes-scale multiplies every stage's bytes (0: the dependency chain alone); --nodep 1 lets the persistent
 * kernels run without waiting for the previous stage (what the waits cost; their outputs then differ); --fence 0
 * drops the __threadfence() before each arrival (the release add alone orders the block's stores, after its
 * barrier); --pdl 0 launches the chain without programmatic dependent launch; --fanin F makes each block of a
 * stage depend on 1/F of the previous stage's blocks (its reads come from those only; the persistent kernels wait
 * for those only, the chain still for the whole grid): what dependencies finer than all-to-all would save.
 * --tail MASK adds a fifth graph, "chain, tails": the chain with some of each layer's byte-less stages folded
 * into the stage before them, as a tail of that stage's kernel (bit 0 kv_append, 1 the split merge, 2 the
 * post-attention norm, 3 the post-FF norm, 4 the post-PLE norm; 28 = the three norms): every block counts itself
 * in a per-stage counter when its output is stored (fence + acq_rel add), the --tail-blocks T blocks that arrive
 * last wait until all have, then do the folded stage's work for all of its blocks (the same loads and stores,
 * the same output bits) — what finishing a post-norm in the split product's last cluster would cost against a
 * launch of its own (docs/cuda-decode-step.md, session 22). Needs --fanin 1.
 * --fold MASK adds a sixth graph, "chain, folded": the byte-less stages of MASK (the same bits) are not launched at
 * all, and the stage after each runs as thread-block clusters of --fold-cs C blocks (default 8) whose prologue does
 * what a post-norm folded into a split consumer would (docs/cuda-decode-step.md, session 26): after the PDL wait,
 * read its slice of the producer's output and of the residual (2 x --xread floats a thread), a block sum, a cluster
 * barrier and the C ranks' sums through distributed shared memory (1/rms of o), a second block sum, barrier and
 * exchange (1/rms of h), then the stage's own work without its x reads (the prologue's loads stand for them).
 * What it answers: whether two in-cluster reductions cost less than the ~2 us launch boundary they replace. The
 * folded graph computes something else (its output is not compared). Needs --fanin 1. --fold-xchg 0 is the
 * control: the same cluster launches and loads without the exchanges (what the reductions themselves cost).
 *
 * Why a synthetic: docs/cuda-decode-step.md's persistent-kernel design rests on the estimate that the ~430
 * dependent grids cost ~2-2.5 us each beyond their bytes; this measures that directly, and the best a persistent
 * kernel could do with the same dependencies, before anyone builds one.
 */
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>
#include <algorithm>

#define THREADS 256
#define CHUNK 16384             /* bytes per ring slot */
#define MAX_RING 8
#define XFLOATS (32 * 1536)     /* a stage's output: 32 rows of the hidden size, fp32 */

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        cudaError_t e_ = (x);                                                                                        \
        if (e_ != cudaSuccess) {                                                                                     \
            fprintf(stderr, "bench_boundary_cost: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);       \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

struct stage {
    int64_t off;   /* into the weight pool, bytes */
    int64_t per;   /* bytes per block (a multiple of 16) */
};

struct params {
    const unsigned char *w;
    const stage *st;
    int n_stages;
    int s0;              /* chain: this launch's stage */
    float *x;            /* [n_stages + 1][XFLOATS]; x[0] is the input */
    unsigned int *count; /* persistent: [n_stages] arrivals */
    int ring;            /* slots in flight + 1 */
    int xread;           /* floats of the previous output each thread reads */
    int bpg;             /* blocks in the grid */
    int nodep;           /* persistent: do not wait for the previous stage (what the barriers cost) */
    int fence;           /* persistent: __threadfence() before the release add (cooperative groups' grid sync has it) */
    int fanin;           /* block j depends on the blocks b of the previous stage with b % fanin == j % fanin */
    int tail;            /* chain: this launch also does stage s0 + 1 (byte-less) in its last tail_blocks blocks */
    int tail_blocks;
    int fold_src;        /* fold_kernel: the x buffer it reads as the producer's output (the dropped norm's input) */
    int fold_xchg;       /* fold_kernel: 0 skips the cluster exchanges (a control: cluster launch and loads only) */
};

__device__ __forceinline__ void cp16(void *dst, const void *src)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ void wait_groups(int n)
{
    switch (n) { /* the ring depth is a runtime knob */
    case 0: wait_group<0>(); break;
    case 1: wait_group<1>(); break;
    case 2: wait_group<2>(); break;
    case 3: wait_group<3>(); break;
    case 4: wait_group<4>(); break;
    case 5: wait_group<5>(); break;
    default: wait_group<6>(); break;
    }
}

/* Chunk c of this block's slice of stage st into ring slot c % ring (16 B per thread per round). */
__device__ __forceinline__ void issue(const params &p, const stage &st, unsigned char *ring, int c)
{
    const int64_t lo = (int64_t)c * CHUNK;
    if (lo >= st.per)
        return;
    const int64_t n = st.per - lo < CHUNK ? st.per - lo : CHUNK;
    const unsigned char *src = p.w + st.off + (int64_t)blockIdx.x * st.per + lo;
    unsigned char *dst = ring + (c % p.ring) * CHUNK;
    for (int64_t i = threadIdx.x * 16; i < n; i += THREADS * 16)
        cp16(dst + i, src + i);
}

__device__ __forceinline__ int nchunks(const stage &st) { return (int)((st.per + CHUNK - 1) / CHUNK); }

/* The first ring - 1 chunks of stage s (one commit group each, empty groups included). */
__device__ __forceinline__ void prologue(const params &p, int s, unsigned char *ring)
{
    const stage st = p.st[s];
    for (int c = 0; c < p.ring - 1; c++) {
        issue(p, st, ring, c);
        commit();
    }
}

/* Where x-read i of thread threadIdx.x of block blk reads the previous output when it depends on all of its
 * producers (fanin 1), and the value it writes at output i of its slice from the sum xs of its reads and tot (the
 * slice's weight checksum): shared by body() and tail_body(), so that the tails' outputs are the chain's bits. */
__device__ __forceinline__ int x_index_all(const params &p, int blk, int i)
{
    return (int)(((int64_t)(blk + i * p.bpg) * THREADS + threadIdx.x) * 97 % XFLOATS);
}
__device__ __forceinline__ float out_value(const params &p, float xs, uint32_t tot, int i)
{
    return 0.5f * xs / (float)p.xread + (float)((tot + i) & 1023) * (1.0f / 1024.0f);
}

/* Everything of stage s after its dependency is met: read the previous output's slice, stream the rest of the
 * weights through the ring, write this block's slice of the output. */
__device__ __forceinline__ void body(const params &p, int s, unsigned char *ring, int blk, int xr = -1,
                                     float xs0 = 0.0f)
{
    __shared__ uint32_t wsum[THREADS / 32];
    const stage st = p.st[s];
    const float *xin = p.x + (int64_t)s * XFLOATS;
    float *xout = p.x + (int64_t)(s + 1) * XFLOATS;
    /* the previous output, spread over all of its producers (ld.cg: another SM wrote it) */
    float xs = xs0;
    /* block b writes outputs [b * per_out, (b + 1) * per_out), the last block the rest too */
    const int per_out = XFLOATS / p.bpg;
    for (int i = 0; i < (xr < 0 ? p.xread : xr); i++) {
        int idx;
        if (p.fanin == 1) {
            idx = x_index_all(p, blk, i);
        } else { /* only from this block's group of producers */
            const int nb = p.bpg / p.fanin, g = blk % p.fanin;
            const int b = g + p.fanin * (int)((blk / p.fanin + i * 7 + threadIdx.x) % nb);
            const int cnt = b == p.bpg - 1 ? XFLOATS - b * per_out : per_out;
            idx = b * per_out + (int)((threadIdx.x * 13 + i) % cnt);
        }
        xs += __ldcg(xin + idx);
    }
    uint32_t acc = 0;
    const int nc = nchunks(st);
    for (int c = 0; c < nc; c++) {
        wait_groups(p.ring - 2);
        __syncthreads(); /* chunk c landed for everyone; slot (c - 1) % ring is free */
        issue(p, st, ring, c + p.ring - 1);
        commit();
        const int64_t n = st.per - (int64_t)c * CHUNK < CHUNK ? st.per - (int64_t)c * CHUNK : CHUNK;
        const uint4 *src = (const uint4 *)(ring + (c % p.ring) * CHUNK);
        for (int i = threadIdx.x; i < n / 16; i += THREADS) {
            const uint4 v = src[i];
            acc += v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    wait_group<0>();
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0)
        wsum[threadIdx.x >> 5] = acc;
    __syncthreads();
    uint32_t tot = 0;
    for (int i = 0; i < THREADS / 32; i++)
        tot += wsum[i];
    const int mine = blk == p.bpg - 1 ? XFLOATS - blk * per_out : per_out;
    for (int i = threadIdx.x; i < mine; i += THREADS)
        xout[blk * per_out + i] = out_value(p, xs, tot, i);
    __syncthreads(); /* the ring and wsum are free again */
}

/* body() of byte-less stage s for the blocks b0, b0 + tail_blocks, ... at once: every block's loads in flight
 * together (one round trip per x-read, as a norm loading its rows), then every block's stores; the same values
 * in the same order as body(), so the same bits. */
#define TAIL_MAX 64 /* blocks one tail block stands in for */
__device__ __forceinline__ void tail_body(const params &p, int s, int b0)
{
    const float *xin = p.x + (int64_t)s * XFLOATS;
    float *xout = p.x + (int64_t)(s + 1) * XFLOATS;
    const int per_out = XFLOATS / p.bpg;
    float xs[TAIL_MAX];
#pragma unroll
    for (int k = 0; k < TAIL_MAX; k++)
        xs[k] = 0.0f;
    for (int i = 0; i < p.xread; i++) {
#pragma unroll
        for (int k = 0; k < TAIL_MAX; k++) {
            const int b = b0 + k * p.tail_blocks;
            if (b < p.bpg)
                xs[k] += __ldcg(xin + x_index_all(p, b, i)); /* --tail needs --fanin 1 */
        }
    }
#pragma unroll
    for (int k = 0; k < TAIL_MAX; k++) {
        const int b = b0 + k * p.tail_blocks;
        if (b >= p.bpg)
            break;
        const int mine = b == p.bpg - 1 ? XFLOATS - b * per_out : per_out;
        for (int i = threadIdx.x; i < mine; i += THREADS)
            xout[b * per_out + i] = out_value(p, xs[k], 0, i); /* no bytes: the checksum is 0 */
    }
}

__device__ __noinline__ void body_call(const params &p, int s, unsigned char *ring) { body(p, s, ring, blockIdx.x); }

extern __shared__ __align__(16) unsigned char smem[];

__global__ void __launch_bounds__(THREADS) chain_kernel(const params p)
{
    asm volatile("griddepcontrol.launch_dependents;" ::);
    prologue(p, p.s0, smem);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    body(p, p.s0, smem, blockIdx.x);
    if (!p.tail)
        return;
    /* the folded stage s0 + 1 (no bytes): the last tail_blocks blocks to finish stage s0 do it for every block */
    __shared__ unsigned int ticket;
    if (threadIdx.x == 0) {
        unsigned int t;
        __threadfence();
        asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(t) : "l"(p.count + p.s0) : "memory");
        ticket = t;
    }
    __syncthreads();
    const int first = p.bpg - p.tail_blocks;
    if ((int)ticket < first)
        return;
    if (threadIdx.x == 0) {
        unsigned int v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p.count + p.s0) : "memory");
        } while (v < (unsigned int)p.bpg);
    }
    __syncthreads();
    tail_body(p, p.s0 + 1, (int)ticket - first);
}

/* The sum of v over the block (every thread gets it); red: THREADS / 32 floats of shared memory. */
__device__ __forceinline__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < THREADS / 32; i++)
        t += red[i];
    __syncthreads(); /* red is free again */
    return t;
}

/* --fold: stage s0 with the post-norm before it done in its prologue, across its cluster (see the header). */
__global__ void __launch_bounds__(THREADS) fold_kernel(const params p)
{
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    __shared__ float red[THREADS / 32];
    __shared__ float part[2]; /* this block's two sums, read by the cluster's other ranks */
    asm volatile("griddepcontrol.launch_dependents;" ::);
    prologue(p, p.s0, smem);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const float *xo = p.x + (int64_t)p.fold_src * XFLOATS;           /* the producer's output (the norm's x) */
    const float *xres = p.x + (int64_t)(p.fold_src > 0 ? p.fold_src - 1 : 0) * XFLOATS; /* stands for the residual */
    float a = 0.0f, r = 0.0f;
    for (int i = 0; i < p.xread; i++) { /* the slices of o and of the residual, loads in flight together */
        const int idx = x_index_all(p, blockIdx.x, i);
        a += __ldcg(xo + idx);
        r += __ldcg(xres + idx);
    }
    const unsigned ranks = p.fold_xchg ? cl.num_blocks() : 0;
    float t = block_sum(a * a, red); /* sum of o^2 over this block's slice */
    float s1 = t;
    if (ranks) {
        if (threadIdx.x == 0)
            part[0] = t;
        cl.sync();
        s1 = 0.0f;
        for (unsigned k = 0; k < ranks; k++)
            s1 += *cl.map_shared_rank(&part[0], k);
    }
    const float h = r + a * rsqrtf(s1 * (1.0f / 1536.0f) + 1e-6f); /* h = res + o / rms(o) */
    t = block_sum(h * h, red);
    float s2 = t;
    if (ranks) {
        if (threadIdx.x == 0)
            part[1] = t;
        cl.sync();
        s2 = 0.0f;
        for (unsigned k = 0; k < ranks; k++)
            s2 += *cl.map_shared_rank(&part[1], k);
        cl.barrier_arrive(); /* done reading the other ranks; waited for at the end, before this block leaves */
    }
    body(p, p.s0, smem, blockIdx.x, 0, h * rsqrtf(s2 * (1.0f / 1536.0f) + 1e-6f));
    if (ranks)
        cl.barrier_wait(); /* no rank leaves (its shared memory) while another may still read it */
}

template <bool CALL>
__global__ void __launch_bounds__(THREADS) persistent_kernel(const params p)
{
    prologue(p, 0, smem);
    for (int s = 0; s < p.n_stages; s++) {
        if (s > 0 && !p.nodep) {
            if (threadIdx.x == 0) {
                const unsigned int *c = p.count + (s - 1) * p.fanin + blockIdx.x % p.fanin;
                unsigned int v;
                do {
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
                } while (v < (unsigned int)(p.bpg / p.fanin));
            }
            __syncthreads();
        }
        if constexpr (CALL)
            body_call(p, s, smem);
        else
            body(p, s, smem, blockIdx.x);
        /* count this block in stage s (its output stores before it), then start stage s + 1's weights */
        if (threadIdx.x == 0) {
            if (p.fence)
                __threadfence();
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.count + s * p.fanin + blockIdx.x % p.fanin) : "memory");
        }
        if (s + 1 < p.n_stages)
            prologue(p, s + 1, smem);
    }
}

__global__ void fill_kernel(unsigned char *w, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n / 4; i += (int64_t)gridDim.x * blockDim.x)
        ((uint32_t *)w)[i] = (uint32_t)(i * 2654435761u) ^ 0x5bd1e995u;
}

__global__ void fill_x(float *x)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < XFLOATS; i += gridDim.x * blockDim.x)
        x[i] = (float)(i % 977) * 0.001f;
}

/* E2B at 32 sequences: per-stage bytes, in order. */
static std::vector<int64_t> e2b_stages(int layers)
{
    const int64_t H = 1536, B = 2, seqs = 32, ctx = 576, window = 512, ple = 256;
    std::vector<int64_t> v;
    for (int l = 0; l < layers; l++) {
        const bool global = l % 5 == 4, owner = l < 15, wide = !owner;
        const int64_t hd = global ? 512 : 256, ffn = wide ? 12288 : 6144;
        const int64_t keys = global ? ctx : (ctx < window ? ctx : window);
        v.push_back(H * (8 * hd + (owner ? 2 * hd : 0)) * B); /* q|k|v or q */
        v.push_back(0);                                        /* kv_append / q-norm + RoPE */
        v.push_back(seqs * keys * 2 * hd * B);                  /* attention: K and V */
        v.push_back(0);                                        /* split merge */
        v.push_back(8 * hd * H * B);                           /* o */
        v.push_back(0);                                        /* post-attention norm */
        v.push_back(2 * H * ffn * B);                          /* gate|up */
        v.push_back(ffn * H * B);                              /* down */
        v.push_back(0);                                        /* post-FF norm */
        v.push_back(H * ple * B);                              /* PLE gate */
        v.push_back(ple * H * B);                              /* PLE projection */
        v.push_back(0);                                        /* post-PLE norm */
    }
    v.push_back(262144 * H * B); /* LM head */
    return v;
}

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    int reps = 20, bps = 2, ring_kb = 64, xread = 8, layers = 35, nodep = 0, fence = 1, pdl = 1, fanin = 1;
    int tail = 0, tail_blocks = 8, fold = 0, fold_cs = 8, fold_xchg = 1;
    double scale = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_boundary_cost: %s needs a value\n", a);
            return 2;
        }
        const int v = atoi(argv[++i]);
        if (!strcmp(a, "--bytes-scale")) scale = atof(argv[i]);
        else if (!strcmp(a, "--nodep")) nodep = v;
        else if (!strcmp(a, "--fence")) fence = v;
        else if (!strcmp(a, "--pdl")) pdl = v;
        else if (!strcmp(a, "--fanin")) fanin = v;
        else if (!strcmp(a, "--tail")) tail = v;
        else if (!strcmp(a, "--tail-blocks")) tail_blocks = v;
        else if (!strcmp(a, "--fold")) fold = v;
        else if (!strcmp(a, "--fold-cs")) fold_cs = v;
        else if (!strcmp(a, "--fold-xchg")) fold_xchg = v;
        else if (!strcmp(a, "--reps")) reps = v;
        else if (!strcmp(a, "--blocks-per-sm")) bps = v;
        else if (!strcmp(a, "--ring-kb")) ring_kb = v;
        else if (!strcmp(a, "--xread")) xread = v;
        else if (!strcmp(a, "--layers")) layers = v;
        else {
            fprintf(stderr, "bench_boundary_cost: unknown option %s\n", a);
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "bench_boundary_cost: no CUDA device\n");
        return 77;
    }
    const int ring = ring_kb * 1024 / CHUNK;
    if (ring < 2 || ring > MAX_RING || reps < 1 || bps < 1 || xread < 1 || layers < 1) {
        fprintf(stderr, "bench_boundary_cost: bad option value (ring %d slots of 16 KiB: 2..%d)\n", ring, MAX_RING);
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t smem_bytes = (size_t)ring * CHUNK;
    CK(cudaFuncSetAttribute(chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    CK(cudaFuncSetAttribute(persistent_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    CK(cudaFuncSetAttribute(persistent_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    int occ = 0, occ_call = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, persistent_kernel<false>, THREADS, smem_bytes));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ_call, persistent_kernel<true>, THREADS, smem_bytes));
    if (occ < bps || occ_call < bps) {
        fprintf(stderr, "bench_boundary_cost: only %d / %d blocks per SM fit with a %d KiB ring\n", occ, occ_call,
                ring_kb);
        return 2;
    }
    const int G = prop.multiProcessorCount * bps;
    if (fanin < 1 || G % fanin != 0 || G > XFLOATS) {
        fprintf(stderr, "bench_boundary_cost: --fanin %d does not divide the grid of %d blocks\n", fanin, G);
        return 2;
    }
    if (tail < 0 || tail > 31 || (tail && fanin != 1) || tail_blocks < 1 || tail_blocks > G ||
        (G + tail_blocks - 1) / tail_blocks > TAIL_MAX) {
        fprintf(stderr, "bench_boundary_cost: --tail is a mask in 0..31 (with --fanin 1), --tail-blocks %d..%d\n",
                (G + TAIL_MAX - 1) / TAIL_MAX, G);
        return 2;
    }

    if (fold < 0 || (fold && (fold > 31 || fanin != 1 || fold_cs < 1 || fold_cs > 8 || G % fold_cs != 0))) {
        fprintf(stderr, "bench_boundary_cost: --fold is a mask in 0..31 (with --fanin 1), --fold-cs 1..8 dividing "
                        "the grid of %d blocks\n", G);
        return 2;
    }
    CK(cudaFuncSetAttribute(fold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes));
    int fold_resident = 0; /* clusters of fold_cs resident at once: fewer than the grid's would add a second wave */
    if (fold) {
        cudaLaunchConfig_t oc = {};
        oc.gridDim = dim3(G);
        oc.blockDim = dim3(THREADS);
        oc.dynamicSmemBytes = smem_bytes;
        cudaLaunchAttribute ca[1];
        ca[0].id = cudaLaunchAttributeClusterDimension;
        ca[0].val.clusterDim.x = (unsigned)fold_cs;
        ca[0].val.clusterDim.y = 1;
        ca[0].val.clusterDim.z = 1;
        oc.attrs = ca;
        oc.numAttrs = 1;
        CK(cudaOccupancyMaxActiveClusters(&fold_resident, fold_kernel, &oc));
    }

    const std::vector<int64_t> sb = e2b_stages(layers);
    const int S = (int)sb.size();
    std::vector<stage> st(S);
    int64_t total = 0;
    for (int s = 0; s < S; s++) {
        int64_t per = ((int64_t)(sb[s] * scale) + G - 1) / G;
        per = (per + 15) / 16 * 16;
        st[s].off = total;
        st[s].per = per;
        total += per * G;
    }
    unsigned char *w;
    float *xa, *xb, *xc;
    stage *dst;
    unsigned int *count;
    CK(cudaMalloc(&w, total));
    CK(cudaMalloc(&xa, sizeof(float) * XFLOATS * (S + 1)));
    CK(cudaMalloc(&xb, sizeof(float) * XFLOATS * (S + 1)));
    CK(cudaMalloc(&xc, sizeof(float) * XFLOATS * (S + 1)));
    CK(cudaMalloc(&dst, sizeof(stage) * S));
    CK(cudaMalloc(&count, sizeof(unsigned int) * S * fanin));
    CK(cudaMemcpy(dst, st.data(), sizeof(stage) * S, cudaMemcpyHostToDevice));
    fill_kernel<<<4 * prop.multiProcessorCount, 256>>>(w, total);
    fill_x<<<64, 256>>>(xa);
    fill_x<<<64, 256>>>(xb);
    fill_x<<<64, 256>>>(xc);
    CK(cudaDeviceSynchronize());

    cudaStream_t str;
    CK(cudaStreamCreateWithFlags(&str, cudaStreamNonBlocking));
    params p = {w, dst, S, 0, xa, count, ring, xread, G, 0, fence, fanin, 0, tail_blocks, 0, fold_xchg};

    /* A chain graph: one PDL launch per stage not folded, writing into x; a launch whose next stage is folded does
     * it as its tail (the counters zeroed first). Returns the launches made. */
    auto capture_chain = [&](float *x, const std::vector<char> &folded, cudaGraphExec_t *out,
                             bool dropped = false) {
        const bool any = std::find(folded.begin(), folded.end(), 1) != folded.end();
        cudaGraph_t g;
        int launches = 0;
        CK(cudaStreamBeginCapture(str, cudaStreamCaptureModeThreadLocal));
        if (any && !dropped) /* the tails' counters (the folded graph has none: no node the chain lacks) */
            CK(cudaMemsetAsync(count, 0, sizeof(unsigned int) * S * fanin, str));
        for (int s = 0; s < S; s++) {
            if (folded[s])
                continue;
            params q = p;
            q.x = x;
            q.s0 = s;
            q.tail = !dropped && s + 1 < S && folded[s + 1];
            const bool after_fold = dropped && s > 0 && folded[s - 1]; /* --fold: the norm before it is gone */
            q.fold_src = s - 1; /* x[s - 1]: the producer's output, which the dropped norm would have read */
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(G);
            cfg.blockDim = dim3(THREADS);
            cfg.dynamicSmemBytes = smem_bytes;
            cfg.stream = str;
            cudaLaunchAttribute at[2];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            at[1].id = cudaLaunchAttributeClusterDimension;
            at[1].val.clusterDim.x = (unsigned)fold_cs;
            at[1].val.clusterDim.y = 1;
            at[1].val.clusterDim.z = 1;
            const int npdl = s > 0 && pdl ? 1 : 0;
            if (after_fold) { /* the cluster attribute after the PDL one (or alone) */
                at[npdl] = at[1];
                cfg.attrs = at;
                cfg.numAttrs = npdl + 1;
                CK(cudaLaunchKernelEx(&cfg, fold_kernel, q));
            } else {
                cfg.attrs = at;
                cfg.numAttrs = npdl;
                CK(cudaLaunchKernelEx(&cfg, chain_kernel, q));
            }
            launches++;
        }
        CK(cudaStreamEndCapture(str, &g));
        CK(cudaGraphInstantiate(out, g, 0));
        CK(cudaGraphDestroy(g));
        return launches;
    };

    /* the chain: S launches with PDL */
    cudaGraphExec_t g_chain, g_pers, g_call, g_floor;
    capture_chain(xa, std::vector<char>(S, 0), &g_chain);
    /* the chain with byte-less stages folded into the stage before them (--tail) */
    cudaGraphExec_t g_tail = nullptr;
    float *xd = nullptr;
    int launches_tail = S;
    if (tail) {
        CK(cudaMalloc(&xd, sizeof(float) * XFLOATS * (S + 1)));
        fill_x<<<64, 256>>>(xd);
        CK(cudaGetLastError());
        static const int pos_of_bit[5] = {1, 3, 5, 8, 11}; /* stage positions within a layer (e2b_stages) */
        std::vector<char> folded(S, 0);
        for (int s = 0; s < S - 1; s++) /* the LM head (last) is never folded */
            for (int k = 0; k < 5; k++)
                if ((tail >> k & 1) && s % 12 == pos_of_bit[k] && sb[s] == 0 && sb[s - 1] > 0)
                    folded[s] = 1;
        launches_tail = capture_chain(xd, folded, &g_tail);
    }
    /* the chain with byte-less stages dropped and the next stage's cluster prologue doing their work (--fold) */
    cudaGraphExec_t g_fold = nullptr;
    float *xe = nullptr;
    int launches_fold = S;
    if (fold) {
        CK(cudaMalloc(&xe, sizeof(float) * XFLOATS * (S + 1)));
        CK(cudaMemset(xe, 0, sizeof(float) * XFLOATS * (S + 1))); /* stages it never writes read zeros */
        fill_x<<<64, 256>>>(xe);
        CK(cudaGetLastError());
        static const int pos_of_bit[5] = {1, 3, 5, 8, 11};
        std::vector<char> folded(S, 0);
        for (int s = 1; s < S - 1; s++) /* a stage with bytes follows each folded one */
            for (int k = 0; k < 5; k++)
                if ((fold >> k & 1) && s % 12 == pos_of_bit[k] && sb[s] == 0 && sb[s - 1] > 0 && sb[s + 1] > 0)
                    folded[s] = 1;
        launches_fold = capture_chain(xe, folded, &g_fold, true);
    }
    for (int call = 0; call < 2; call++) {
        cudaGraph_t g;
        params q = p;
        q.x = call ? xc : xb;
        q.nodep = nodep;
        CK(cudaStreamBeginCapture(str, cudaStreamCaptureModeThreadLocal));
        CK(cudaMemsetAsync(count, 0, sizeof(unsigned int) * S * fanin, str));
        if (call)
            persistent_kernel<true><<<G, THREADS, smem_bytes, str>>>(q);
        else
            persistent_kernel<false><<<G, THREADS, smem_bytes, str>>>(q);
        CK(cudaGetLastError());
        CK(cudaStreamEndCapture(str, &g));
        CK(cudaGraphInstantiate(call ? &g_call : &g_pers, g, 0));
        CK(cudaGraphDestroy(g));
    }
    /* the floor: all bytes as one stage, no dependency (its output is not compared) */
    stage *fst;
    float *xf;
    {
        stage f = {0, (total / G + 15) / 16 * 16};
        while (f.per * G > total)
            f.per -= 16;
        CK(cudaMalloc(&fst, sizeof(stage)));
        CK(cudaMalloc(&xf, sizeof(float) * XFLOATS * 2));
        CK(cudaMemcpy(fst, &f, sizeof f, cudaMemcpyHostToDevice));
        fill_x<<<64, 256>>>(xf);
        params q = p;
        q.st = fst;
        q.n_stages = 1;
        q.x = xf;
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(str, cudaStreamCaptureModeThreadLocal));
        chain_kernel<<<G, THREADS, smem_bytes, str>>>(q);
        CK(cudaGetLastError());
        CK(cudaStreamEndCapture(str, &g));
        CK(cudaGraphInstantiate(&g_floor, g, 0));
        CK(cudaGraphDestroy(g));
    }

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const char *names[6] = {"chain (PDL)", "persistent", "persistent-call", "floor (one stream)", "chain, tails",
                            "chain, folded"};
    cudaGraphExec_t gs[6] = {g_chain, g_pers, g_call, g_floor, g_tail, g_fold};
    int ks[6], ng = 0; /* the graphs made */
    for (int k = 0; k < 6; k++)
        if (gs[k])
            ks[ng++] = k;
    std::vector<float> t[6];
    for (int r = 0; r < reps + 2; r++) /* interleaved, two warm-up rounds */
        for (int j = 0; j < ng; j++) {
            const int k = ks[j];
            CK(cudaEventRecord(e0, str));
            CK(cudaGraphLaunch(gs[k], str));
            CK(cudaEventRecord(e1, str));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 2)
                t[k].push_back(ms * 1000.0f);
        }

    /* the chain and the persistent kernels computed the same thing */
    std::vector<float> ha(XFLOATS), hb(XFLOATS), hc(XFLOATS);
    CK(cudaMemcpy(ha.data(), xa + (int64_t)S * XFLOATS, sizeof(float) * XFLOATS, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), xb + (int64_t)S * XFLOATS, sizeof(float) * XFLOATS, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hc.data(), xc + (int64_t)S * XFLOATS, sizeof(float) * XFLOATS, cudaMemcpyDeviceToHost));
    bool same = memcmp(ha.data(), hb.data(), sizeof(float) * XFLOATS) == 0 &&
                memcmp(ha.data(), hc.data(), sizeof(float) * XFLOATS) == 0;
    if (tail) {
        std::vector<float> hd(XFLOATS);
        CK(cudaMemcpy(hd.data(), xd + (int64_t)S * XFLOATS, sizeof(float) * XFLOATS, cudaMemcpyDeviceToHost));
        same = same && memcmp(ha.data(), hd.data(), sizeof(float) * XFLOATS) == 0;
    }

    printf("%s, %d SMs; %d stages (%d layers), %.3f GB (bytes x %.2f%s%s%s, fan-in 1/%d); grid %d blocks (%d per SM), ring %d KiB, %d x-reads per "
           "thread, %d replays each (median)\n",
           prop.name, prop.multiProcessorCount, S, layers, total / 1e9, scale,
           nodep ? ", persistent kernels do not wait: outputs differ" : "", fence ? "" : ", no fence",
           pdl ? "" : ", chain without PDL", fanin, G, bps, ring_kb, xread, reps);
    const float floor_us = median(t[3]);
    for (int j = 0; j < ng; j++) {
        const int k = ks[j];
        const float us = median(t[k]);
        printf("  %-20s %9.1f us  %6.0f GB/s  %+8.1f us over the floor (%.2f us per stage)\n", names[k], us,
               total / (us * 1e3), us - floor_us, (us - floor_us) / S);
    }
    if (tail)
        printf("  chain, tails: %d launches instead of %d (mask %d, %d tail blocks): %+.2f us per folded stage\n",
               launches_tail, S, tail, tail_blocks,
               (median(t[4]) - median(t[0])) / (S - launches_tail > 0 ? S - launches_tail : 1));
    if (fold)
        printf("  chain, folded: %d launches instead of %d (mask %d, clusters of %d, %d of the grid's %d resident at "
               "once%s%s): %+.2f us per folded stage\n",
               launches_fold, S, fold, fold_cs, fold_resident, G / fold_cs,
               fold_resident * fold_cs < G ? ": a second wave" : "", fold_xchg ? "" : "; no exchanges: the control",
               (median(t[5]) - median(t[0])) / (S - launches_fold > 0 ? S - launches_fold : 1));
    printf("  outputs of the chain%s and both persistent kernels: %s\n", tail ? ", the chain with tails" : "",
           same ? "identical" : "DIFFERENT");
    return same || nodep ? 0 : 1;
}

/*
 * ktrace.c — every kernel a CUDA program runs, with its GPU start and end times, graph replays included: a CUPTI
 * injection library. Load it into any run (berth bench, a test) without rebuilding the program:
 *
 *   CUDA_INJECTION64_PATH=$PWD/build/bench/libberth_ktrace.so KTRACE_OUT=/tmp/k.csv build/host/berth bench ...
 *   python3 bench/ktrace_summary.py /tmp/k.csv              # per-kernel table of one decode step
 *
 * Why: ncu times kernels one at a time (each replayed alone: no programmatic-dependent-launch overlap, no
 * L2 carried over) and Nsight Systems is not on the GPU machine, so a decode step's real timeline — how long each
 * kernel runs inside the graph, and how much of its neighbour it overlaps — was only ever inferred from ablations.
 * CUPTI's concurrent-kernel activity records give it directly, at a small cost per kernel.
 *
 * Output (CSV, one line per kernel, in the order CUPTI delivers its buffers, which is not always start order):
 * start_ns,end_ns,device,stream,graph,graph_node,grid_x,grid_y,grid_z,block_x,block_y,block_z,cluster_x,
 * dyn_smem,regs,name (mangled; the summary demangles). Copies and memsets are lines too, grid and block 0, named
 * "memcpy_HtoD_<bytes>" (HtoD, DtoH, DtoD, other) or "memset_<bytes>": what runs between two graph replays is
 * part of a step's time. KTRACE_OUT (default ktrace.csv) names the file; KTRACE_MAX (default 2,000,000) caps the
 * records written.
 */
#include <cupti.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KT_BUF_BYTES (8u << 20)

static FILE *kt_out;
static uint64_t kt_written, kt_max = 2000000;

static void CUPTIAPI kt_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, KT_BUF_BYTES) /* CUPTI wants 8-byte aligned buffers */;
    *size = *buffer ? KT_BUF_BYTES : 0;
    *max_records = 0; /* as many as fit */
}

/* One copy or memset as a CSV line in the kernels' columns (no grid, block, cluster, smem or registers). */
static void kt_copy(const CUpti_Activity *rec)
{
    char name[64];
    uint64_t start, end, node;
    uint32_t dev, stream, graph;
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
        const char *dir = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "HtoD"
                          : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "DtoH"
                          : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOD ? "DtoD"
                                                                          : "other";
        snprintf(name, sizeof name, "memcpy_%s_%llu", dir, (unsigned long long)m->bytes);
        start = m->start, end = m->end, dev = m->deviceId, stream = m->streamId, graph = m->graphId;
        node = m->graphNodeId;
    } else {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
        snprintf(name, sizeof name, "memset_%llu", (unsigned long long)m->bytes);
        start = m->start, end = m->end, dev = m->deviceId, stream = m->streamId, graph = m->graphId;
        node = m->graphNodeId;
    }
    fprintf(kt_out, "%llu,%llu,%u,%u,%u,%llu,0,0,0,0,0,0,0,0,0,%s\n", (unsigned long long)start,
            (unsigned long long)end, dev, stream, graph, (unsigned long long)node, name);
    kt_written++;
}

static void CUPTIAPI kt_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                         size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *rec = NULL;
    while (kt_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (kt_written >= kt_max)
            break;
        if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY || rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            kt_copy(rec);
            continue;
        }
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(kt_out, "%llu,%llu,%u,%u,%u,%llu,%d,%d,%d,%d,%d,%d,%u,%d,%u,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->deviceId, k->streamId, k->graphId,
                (unsigned long long)k->graphNodeId, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ,
                k->clusterX, k->dynamicSharedMemory, (unsigned)k->registersPerThread, k->name ? k->name : "?");
        kt_written++;
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(NULL, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
        fprintf(stderr, "ktrace: CUPTI dropped %zu records\n", dropped);
    free(buffer);
}

static void kt_finish(void)
{
    cuptiActivityFlushAll(1);
    if (kt_out) {
        fclose(kt_out);
        kt_out = NULL;
        fprintf(stderr, "ktrace: %llu kernels written\n", (unsigned long long)kt_written);
    }
}

static int kt_fail(const char *what, CUptiResult r)
{
    const char *msg = NULL;
    cuptiGetResultString(r, &msg);
    fprintf(stderr, "ktrace: %s: %s\n", what, msg ? msg : "unknown CUPTI error");
    return 0;
}

/* Called by the CUDA driver when CUDA_INJECTION64_PATH names this library (before the program's first CUDA
 * call returns). Returns 1 on success. */
__attribute__((visibility("default"))) int InitializeInjection(void)
{
    const char *path = getenv("KTRACE_OUT");
    const char *max = getenv("KTRACE_MAX");
    if (max && *max)
        kt_max = strtoull(max, NULL, 10);
    kt_out = fopen(path && *path ? path : "ktrace.csv", "w");
    if (!kt_out) {
        fprintf(stderr, "ktrace: cannot write '%s'\n", path && *path ? path : "ktrace.csv");
        return 0;
    }
    fprintf(kt_out, "start_ns,end_ns,device,stream,graph,graph_node,grid_x,grid_y,grid_z,block_x,block_y,block_z,"
                    "cluster_x,dyn_smem,regs,name\n");
    CUptiResult r = cuptiActivityRegisterCallbacks(kt_buffer_requested, kt_buffer_completed);
    if (r != CUPTI_SUCCESS)
        return kt_fail("cuptiActivityRegisterCallbacks", r);
    /* concurrent kernels: the kernel kind would serialise every launch, and with it the overlap we want to see */
    if ((r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)) != CUPTI_SUCCESS)
        return kt_fail("cuptiActivityEnable (concurrent kernels)", r);
    if ((r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY)) != CUPTI_SUCCESS)
        return kt_fail("cuptiActivityEnable (copies)", r);
    if ((r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET)) != CUPTI_SUCCESS)
        return kt_fail("cuptiActivityEnable (memsets)", r);
    atexit(kt_finish);
    return 1;
}

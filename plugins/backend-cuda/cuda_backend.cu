/*
 * cuda_backend.cu — the CUDA backend plugin's core: device probe, device info, context, configuration, streams
 * with their workspaces, buffers, supports() and the op table. The ops live one family per file (matmul.cu,
 * norm.cu, elementwise.cu, rope.cu, kv_append.cu, attention.cu, sample.cu); cuda_internal.h is what they share.
 *
 * Rules this file keeps (plugin.h): CUDA is initialised lazily — nothing in berth_plugin_entry or in static
 * constructors touches the runtime, so the .so loads on machines without a driver. Every CUDA/cuBLAS error
 * becomes a berth_status plus a one-line message through host->set_error; nothing aborts, throws or prints.
 * A sticky device error (illegal address, launch failure, ...) marks the backend lost: every later call fails
 * with BERTH_E_DEVICE_LOST. Only berth_plugin_entry is exported (meson builds with hidden visibility).
 */
#include "cuda_internal.h"
#include "env_switch.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The oldest compute capability the fatbinary can run (meson passes it with the matching -gencode flags). */
#ifndef CUDA_MIN_SM
#define CUDA_MIN_SM 90
#endif

/* cuBLAS gets a fixed workspace so that it never allocates inside a graph capture. */
#define CU_CUBLAS_WS_BYTES (32u << 20)

// ---------------------------------------------------------------------------------------------------------------
// Errors.

berth_status cu_fail(const berth_host *host, berth_status code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (host && host->set_error)
        host->set_error(host->ctx, code, msg);
    return code;
}

static void cuda_log(const berth_host *host, int32_t level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void cuda_log(const berth_host *host, int32_t level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (host && host->log)
        host->log(host->ctx, level, msg);
}

/* An integer switch: unset or empty -> dflt; a value cu_env_parse_int accepts (env_switch.h: decimal digits in
 * [lo, hi], a multiple of step) -> that value; anything else is logged as "cuda: NAME='v' ignored: EXPECTED is
 * expected" and keeps dflt. */
static int env_int(const berth_host *host, const char *name, int lo, int hi, int step, int dflt, const char *expected)
{
    const char *v = getenv(name);
    int n = dflt;
    if (!v || !*v || cu_env_parse_int(v, lo, hi, step, &n))
        return n;
    cuda_log(host, BERTH_LOG_WARN, "cuda: %s='%s' ignored: %s is expected", name, v, expected);
    return dflt;
}

/* A switch among names: unset or empty -> dflt; names[i] -> values[i]; anything else is logged as env_int does
 * (EXPECTED lists the names). */
typedef struct cu_env_name env_name;
static int env_choice(const berth_host *host, const char *name, const env_name *names, size_t n, int dflt,
                      const char *expected)
{
    const char *v = getenv(name);
    int r = dflt;
    if (!v || !*v || cu_env_parse_choice(v, names, n, &r))
        return r;
    cuda_log(host, BERTH_LOG_WARN, "cuda: %s='%s' ignored: %s is expected", name, v, expected);
    return dflt;
}
#define ENV_NAMES(a) (a), sizeof(a) / sizeof((a)[0])

/* A 0/1 switch: exactly "0" or "1", as env_choice reads names. */
static int env_flag(const berth_host *host, const char *name, int dflt)
{
    static const env_name flag[] = {{"0", 0}, {"1", 1}};
    return env_choice(host, name, ENV_NAMES(flag), dflt, "0 or 1");
}

/* Errors after which the CUDA context is unusable (the runtime reports them for every later call). */
static int cuda_error_is_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorUnknown:
        return 1;
    default:
        return 0;
    }
}

static berth_status cuda_status_of(cudaError_t e)
{
    if (e == cudaErrorMemoryAllocation)
        return BERTH_E_DEVICE_OOM;
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return BERTH_E_NO_DEVICE;
    if (cuda_error_is_sticky(e))
        return BERTH_E_DEVICE_LOST;
    return BERTH_E_BACKEND;
}

/* Turn a failed CUDA call on backend be into a status + message ("what" names the call and its arguments). */
berth_status cu_check(berth_backend *be, cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return BERTH_OK;
    berth_status st = cuda_status_of(e);
    if (st == BERTH_E_DEVICE_LOST && !be->lost) {
        be->lost = 1;
        snprintf(be->lost_reason, sizeof be->lost_reason, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    }
    (void)cudaGetLastError(); /* clear a non-sticky error so it does not resurface in an unrelated call */
    return cu_fail(be->host, st, "cuda device %d: %s: %s: %s", be->device, what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

berth_status cu_cublas_check(berth_backend *be, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return BERTH_OK;
    berth_status st = s == CUBLAS_STATUS_ALLOC_FAILED ? BERTH_E_DEVICE_OOM : BERTH_E_BACKEND;
    return cu_fail(be->host, st, "cuda device %d: %s: %s: %s", be->device, what, cublasGetStatusName(s),
                     cublasGetStatusString(s));
}

/* Every entry point that touches the device starts here: refuse a lost device, make ours current (a host
 * thread may drive several devices). */
berth_status cu_check_launch(berth_backend *be, const char *kernel)
{
    return cu_check(be, cudaGetLastError(), kernel);
}

berth_status cu_enter(berth_backend *be)
{
    if (be->lost)
        return cu_fail(be->host, BERTH_E_DEVICE_LOST, "cuda device %d: device lost after an earlier error (%s)",
                         be->device, be->lost_reason);
    return cu_check(be, cudaSetDevice(be->device), "cudaSetDevice");
}

/* Copy a filled out-struct into the caller's, writing only the bytes the caller's struct_size covers. */
static void cuda_copy_out(void *out, const void *full, size_t full_size, uint32_t caller_size)
{
    size_t n = caller_size < full_size ? caller_size : full_size;
    memcpy((char *)out + sizeof(uint32_t), (const char *)full + sizeof(uint32_t), n - sizeof(uint32_t));
}

static berth_status read_compute(const berth_host *host, int *out);

// ---------------------------------------------------------------------------------------------------------------
// Probe and device info. No context is created here: listing plugins must stay cheap on an 8-GPU machine.

/* Device count, treating "no GPU" and "no (new enough) driver" as 0 devices. why gets the reason when 0. */
static berth_status cuda_device_count(const berth_host *host, int *count, char *why, size_t why_size)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
        (void)cudaGetLastError();
        *count = 0;
        snprintf(why, why_size, "0 CUDA devices: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return BERTH_OK;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *count = 0;
        snprintf(why, why_size, "0 CUDA devices: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
        return cu_fail(host, BERTH_E_BACKEND, "cuda: cudaGetDeviceCount: %s: %s", cudaGetErrorName(e),
                         cudaGetErrorString(e));
    }
    *count = n;
    if (n == 0)
        snprintf(why, why_size, "0 CUDA devices: cudaGetDeviceCount returned 0");
    return BERTH_OK;
}

static berth_status cuda_probe(const berth_host *host, berth_probe_info *out)
{
    if (!out || out->struct_size < BERTH_SIZE_TO(berth_probe_info, n_devices))
        return cu_fail(host, BERTH_E_ABI, "cuda: probe: out is NULL or its struct_size is too small");
    berth_probe_info info;
    memset(&info, 0, sizeof info);
    int n = 0;
    berth_status st = cuda_device_count(host, &n, info.message, sizeof info.message);
    info.n_devices = n;
    if (st == BERTH_OK && n > 0) {
        int rt = 0, drv = 0;
        (void)cudaRuntimeGetVersion(&rt);
        (void)cudaDriverGetVersion(&drv);
        snprintf(info.message, sizeof info.message, "%d CUDA device%s (runtime %d.%d, driver %d.%d)", n,
                 n == 1 ? "" : "s", rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10);
    }
    cuda_copy_out(out, &info, sizeof info, out->struct_size);
    return st;
}

static berth_status cuda_device_info(const berth_host *host, int32_t idx, berth_device_info *out)
{
    if (!out || out->struct_size < BERTH_SIZE_TO(berth_device_info, index))
        return cu_fail(host, BERTH_E_ABI, "cuda: device_info: out is NULL or its struct_size is too small");
    int n = 0;
    char why[256];
    berth_status st = cuda_device_count(host, &n, why, sizeof why);
    if (st != BERTH_OK)
        return st;
    if (idx < 0 || idx >= n)
        return cu_fail(host, BERTH_E_NOT_FOUND, "cuda: device_info: device %d does not exist (%d CUDA device%s)",
                         idx, n, n == 1 ? "" : "s");
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, idx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cu_fail(host, cuda_status_of(e), "cuda: cudaGetDeviceProperties(%d): %s: %s", idx,
                         cudaGetErrorName(e), cudaGetErrorString(e));
    }
    berth_device_info info;
    memset(&info, 0, sizeof info);
    info.index = idx;
    snprintf(info.name, sizeof info.name, "%.100s (sm_%d%d)", prop.name, prop.major, prop.minor);
    info.total_memory = prop.totalGlobalMem;
    /* Reading free memory needs a context (cudaMemGetInfo); creating one per device just to list them costs
     * hundreds of MiB each, so report the total here and let init log the real figure. */
    info.free_memory = prop.totalGlobalMem;
    info.caps = BERTH_CAP_ASYNC | BERTH_CAP_GRAPHS;
    info.weight_dtypes = CU_WEIGHT_DTYPES;
    info.act_dtypes = CU_ACT_DTYPES;
    info.kv_dtypes = CU_KV_DTYPES;
    info.compute_units = prop.multiProcessorCount;
    /* bf16 KV halves the bytes attention reads; the fp32 parity mode keeps the cache exact. */
    int compute = CU_COMPUTE_BF16;
    if ((st = read_compute(host, &compute)) != BERTH_OK)
        return st;
    info.preferred_kv_dtype = compute == CU_COMPUTE_FP32 ? BERTH_DTYPE_F32 : BERTH_DTYPE_BF16;
    cuda_copy_out(out, &info, sizeof info, out->struct_size);
    return BERTH_OK;
}

// ---------------------------------------------------------------------------------------------------------------
// Context.

static void cuda_destroy(berth_backend *be);

/* [backend.cuda] compute: bf16 (default: tensor cores with bf16 operands, fp32 accumulation) or fp32 (every
 * product in fp32; the parity mode). */
static berth_status read_compute(const berth_host *host, int *out)
{
    const char *v = host && BERTH_HAS(host, berth_host, config_get) && host->config_get
                        ? host->config_get(host->ctx, "compute")
                        : NULL;
    if (!v || !*v || strcmp(v, "bf16") == 0) {
        *out = CU_COMPUTE_BF16;
        return BERTH_OK;
    }
    if (strcmp(v, "fp32") == 0) {
        *out = CU_COMPUTE_FP32;
        return BERTH_OK;
    }
    return cu_fail(host, BERTH_E_INVALID, "[backend.cuda] compute = '%.60s' must be fp32 or bf16", v);
}

static void buffer_facts(const berth_buffer *b, uintptr_t *addr, uint64_t *size, int *read_only)
{
    *addr = (uintptr_t)b->ptr;
    *size = b->size;
    *read_only = 0;
}

static void stream_free(struct berth_stream *s)
{
    /* Queued kernels may still use the workspaces: drain first (a lost device returns at once with an error). */
    (void)cudaStreamSynchronize(s->cs);
    if (s->dev.ptr)
        (void)cudaFree(s->dev.ptr);
    if (s->ynorm_count)
        (void)cudaFree(s->ynorm_count);
    if (s->att_count)
        (void)cudaFree(s->att_count);
    if (s->att_prof)
        (void)cudaFree(s->att_prof);
    if (s->gprof)
        (void)cudaFree(s->gprof);
    free(s->gprof_reg);
    if (s->xsh_buf)
        (void)cudaFree(s->xsh_buf);
    if (s->kvlocal_bt)
        (void)cudaFree(s->kvlocal_bt);
    while (s->retired) {
        struct cu_retired *r = s->retired;
        s->retired = r->next;
        (void)cudaFree(r->ptr);
        free(r);
    }
    (void)cudaStreamDestroy(s->cs);
    if (s->host_free)
        (void)cudaEventDestroy(s->host_free);
    if (s->host.ptr)
        (void)cudaFreeHost(s->host.ptr);
    free(s);
}

static berth_status cuda_init(const berth_host *host, int32_t idx, berth_backend **out)
{
    if (!out)
        return cu_fail(host, BERTH_E_INVALID, "cuda: init: out is NULL");
    int n = 0;
    char why[256];
    berth_status st = cuda_device_count(host, &n, why, sizeof why);
    if (st != BERTH_OK)
        return st;
    if (n == 0)
        return cu_fail(host, BERTH_E_NO_DEVICE, "cuda: init: %s", why);
    if (idx < 0 || idx >= n)
        return cu_fail(host, BERTH_E_NOT_FOUND, "cuda: init: device %d does not exist (%d CUDA device%s)", idx, n,
                         n == 1 ? "" : "s");
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, idx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cu_fail(host, cuda_status_of(e), "cuda: cudaGetDeviceProperties(%d): %s: %s", idx,
                         cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (prop.major * 10 + prop.minor < CUDA_MIN_SM)
        return cu_fail(host, BERTH_E_UNSUPPORTED, "cuda: device %d (%s) is sm_%d%d; this build needs sm_%d or newer",
                         idx, prop.name, prop.major, prop.minor, CUDA_MIN_SM);

    int compute;
    if ((st = read_compute(host, &compute)) != BERTH_OK)
        return st;

    berth_backend *be = (berth_backend *)calloc(1, sizeof *be);
    if (!be)
        return cu_fail(host, BERTH_E_NOMEM, "cuda: init: out of host memory");
    be->host = host;
    be->device = idx;
    be->compute = compute;
    be->n_sms = prop.multiProcessorCount;
    be->smem_optin = prop.sharedMemPerBlockOptin;
    /* The measurement and test switches (docs/config.md), read once here. */
    be->pdl = env_flag(host, "BERTH_CUDA_PDL", 1) ? CU_PDL_ON : CU_PDL_OFF;
    be->att_split_keys =
        env_int(host, "BERTH_CUDA_ATT_SPLIT_KEYS", 16, 4096, 16, 16, "a multiple of 16 in 16..4096");
    static const env_name att_decode[] = {{"auto", CU_ATT_DECODE_AUTO}, {"mma", CU_ATT_DECODE_MMA},
                                          {"new", CU_ATT_DECODE_CLUSTER}, {"c8", CU_ATT_DECODE_CLUSTER8},
                                          {"old", CU_ATT_DECODE_OLD}};
    be->att_decode = env_choice(host, "BERTH_CUDA_ATT_DECODE", ENV_NAMES(att_decode), CU_ATT_DECODE_AUTO,
                                "'auto', 'mma', 'new', 'c8' or 'old'");
    /* Late in the one-launch cluster kernel (batch 1-4): the next kernel (o_proj's GEMV) then starts its early
     * weight loads after attention has its K/V, not while it waits for them (E2B decode on the H200: +1.7% at
     * batch 1; session 5; early there is still -1.6% in session 18). Early in the tensor-core kernel (8+
     * sequences): the o projection's blocks then get resident and load their weights during attention's tail
     * (+1.8% at 8 sequences, +0.7% at 32; session 18). */
    static const env_name trigger[] = {{"late", CU_ATT_TRIGGER_LATE}, {"early", CU_ATT_TRIGGER_EARLY},
                                       {"auto", CU_ATT_TRIGGER_AUTO}};
    be->att_trigger = env_choice(host, "BERTH_CUDA_ATT_TRIGGER", ENV_NAMES(trigger), CU_ATT_TRIGGER_AUTO,
                                 "'early', 'late' or 'auto'");
    be->att_mma_bps = env_int(host, "BERTH_CUDA_ATT_MMA_BPS", 0, 8, 1, 0, "0..8");
    /* On by default: E2B decode on the H200 +4.3% at batch 1, +2% at 8 and 32 (session 5). Its assumption about
     * the host is in attention_decode.cu ("Reads before the PDL wait"); =0 is the escape. */
    be->att_prewait = env_flag(host, "BERTH_CUDA_ATT_PREWAIT", 1);
    be->att_strict = env_flag(host, "BERTH_CUDA_ATT_STRICT", 0);
    static const env_name prof[] = {{"0", CU_ATT_PROF_OFF}, {"1", CU_ATT_PROF_EAGER}, {"graph", CU_ATT_PROF_GRAPH}};
    be->att_prof = env_choice(host, "BERTH_CUDA_ATT_PROF", ENV_NAMES(prof), CU_ATT_PROF_OFF, "0, 1 or graph");
    be->norm_lean = env_flag(host, "BERTH_CUDA_NORM_LEAN", 1);
    be->norm_y2_onepass = env_flag(host, "BERTH_CUDA_NORM_Y2_ONEPASS", 1);
    be->kv_lean = env_flag(host, "BERTH_CUDA_KV_LEAN", 1);
    be->gemv_gelu = env_flag(host, "BERTH_CUDA_GEMV_GELU", 1);
    static const env_name merge[] = {{"kernel", 1}, {"last", 0}};
    be->att_merge_kernel = env_choice(host, "BERTH_CUDA_ATT_MERGE", ENV_NAMES(merge), 1, "'kernel' or 'last'");
    be->att_ring2 = env_flag(host, "BERTH_CUDA_ATT_RING2", 0);
    be->att_onepass = env_flag(host, "BERTH_CUDA_ATT_ONEPASS", 1);
    be->att_d512_warps = env_int(host, "BERTH_CUDA_ATT_D512_WARPS", 4, 8, 4, 8, "4 or 8");
    static const env_name gemv[] = {{"new", CU_GEMV_NEW}, {"async", CU_GEMV_ASYNC}, {"old", CU_GEMV_OLD}};
    be->gemv_mode = env_choice(host, "BERTH_CUDA_GEMV", ENV_NAMES(gemv), CU_GEMV_NEW, "'new', 'async' or 'old'");
    be->gemv_bps = env_int(host, "BERTH_CUDA_GEMV_BPS", 1, 4, 1, 4, "1..4");
    be->gemv_early_mib = env_int(host, "BERTH_CUDA_GEMV_EARLY_MIB", 0, CU_GEMV_EARLY_ALL, 1, CU_GEMV_EARLY_ALL,
                                 "a size in MiB, 0..1048576");
    be->skinny_min_m = env_int(host, "BERTH_CUDA_SKINNY", 0, 64, 1, CU_SKINNY_MIN_M,
                               "0 (off), 1 (on) or the smallest M in 2..64");
    if (be->skinny_min_m == 1) /* on: the default bound */
        be->skinny_min_m = CU_SKINNY_MIN_M;
    be->skinny_max_m = env_int(host, "BERTH_CUDA_SKINNY_MAX", 2, 64, 1, CU_SKINNY_MAX_M, "the largest M in 2..64");
    be->skinny_small = env_flag(host, "BERTH_CUDA_SKINNY_SMALL", 1);
    /* The small products (the PLE pair) on the XH instances too: E2B decode on the H200 +0.8% at 32 sequences (5 of 5
     * rounds), +0.5% at 16 (bench/RESULTS.md session 19). */
    be->skinny_small_xh = env_flag(host, "BERTH_CUDA_SKINNY_SMALL_XH", 1);
    be->skinny_unsplit_waves = env_int(host, "BERTH_CUDA_SKINNY_UNSPLIT_WAVES", 0, 64, 1, 0, "0 (always) or 1..64");
    be->skinny_trim = env_flag(host, "BERTH_CUDA_SKINNY_TRIM", 0);
    be->skinny_u_prefetch = env_flag(host, "BERTH_CUDA_SKINNY_UPREFETCH", 1);
    be->skinny_end_relaxed = env_flag(host, "BERTH_CUDA_SKINNY_END_RELAXED", 1);
    /* The push reduction: E2B decode on the H200 +4.2% at 32 sequences (4 of 4 rounds; 8 sequences do not take
     * it), bench/RESULTS.md session 29. */
    be->skinny_push = env_int(host, "BERTH_CUDA_SKINNY_PUSH", 0, 2, 1, 1,
                              "0, 1 (push reduction) or 2 (push, last cluster barrier kept relaxed)");
    be->skinny_wgmma = env_int(host, "BERTH_CUDA_SKINNY_WGMMA", 0, 2, 1, 1, "0, 1 (wgmma) or 2 (wgmma + TMA)");
    /* the TMA instances' tensor maps are encoded by the driver (cuTensorMapEncodeTiled, CUDA 12.0), reached
     * through the runtime so that the plugin does not link libcuda itself; without it they fall back to cp.async */
    {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050 /* the versioned query; CUDA 13 deprecates the other */
        const cudaError_t ge = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                                cudaEnableDefault, &q);
#else
        const cudaError_t ge = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &q);
#endif
        if (ge == cudaSuccess && q == cudaDriverEntryPointSuccess && fn)
            be->tmap_encode = fn;
        else
            (void)cudaGetLastError();
    }
    be->xshadow = env_flag(host, "BERTH_CUDA_XSHADOW", 1);
    /* Small copies as kernels (copy.cu) need pinned memory mapped at the same address: unified addressing. */
    be->copy_kernel = env_flag(host, "BERTH_CUDA_COPY_KERNEL", 1) && prop.unifiedAddressing;
    /* 32: E2B decode on the H200 +2.5-4.7% at 32 sequences, -7% at 64 with 64 (bench/RESULTS.md session 11) */
    be->skinny_plain = env_int(host, "BERTH_CUDA_SKINNY_PLAIN", 0, 64, 1, CU_SKINNY_PLAIN_M,
                               "0 (off) or the largest M in 1..64");
    /* Products with their norm (x_pre) on the XH instances above skinny_max_m rows, up to this many: on the H200
     * (bench/RESULTS.md session 9) +3.3% at 32 sequences, -4% at 64, unchanged at 16, so 32 by default */
    be->skinny_xpre = env_int(host, "BERTH_CUDA_SKINNY_XPRE", 0, 64, 1, CU_SKINNY_XPRE_M,
                              "0 (off), 1 (up to 64 rows) or the largest M in 2..64");
    if (be->skinny_xpre == 1)
        be->skinny_xpre = 64;
    be->skinny_strict = env_flag(host, "BERTH_CUDA_SKINNY_STRICT", 0);
    static const env_name mg[] = {{"0", 0}, {"8", 8}, {"16", 16}, {"32", 32}};
    be->skinny_mg = env_choice(host, "BERTH_CUDA_SKINNY_MG", ENV_NAMES(mg), 0, "0, 8, 16 or 32");
    be->skinny_small_splits = env_int(host, "BERTH_CUDA_SKINNY_SMALL_SPLITS", 1, 16, 1, 16, "1..16");
    /* 64 rows of w per block where that tile exists: on the H200 it beat the bandwidth model's own choice end to
     * end (E2B decode, 8 / 16 sequences: 2531 / 4259 tok/s against 2343 / 4146; bench/RESULTS.md session 4). */
    static const env_name bn[] = {{"32", 32}, {"64", 64}, {"128", 128}, {"256", 256}, {"auto", 0}};
    be->skinny_bn = env_choice(host, "BERTH_CUDA_SKINNY_BN", ENV_NAMES(bn), 64, "32, 64, 128, 256 or auto");
    /* Products that need no K split (gate|up, the LM head: many column blocks) in blocks of 32 rows of w where that
     * tile exists (x already rounded: above CU_SKINNY_MAX_M rows): twice as many blocks, which get resident beside their
     * neighbours under PDL — E2B decode at 32 sequences +1.35% (7 of 7 rounds), 16 and 64 even (bench/RESULTS.md
     * session 18; a wider, single-wave tiling was 5.5% slower there). Also on the wgmma instances, where a 32-row
     * tile pads each wgmma's 64 rows with 32 unused ones: 64 there measured +0.9% in one same-call A/B and -0.8% in
     * the next (session 24) — noise, so the finer grid stays. */
    be->skinny_bn_unsplit = env_choice(host, "BERTH_CUDA_SKINNY_BN_UNSPLIT", ENV_NAMES(bn), 32,
                                       "32, 64, 128, 256 or auto");
    /* Off by default: on the H200 the fused tail measured slower than the second launch (E2B batch 1: 420 against
     * 444 tok/s, bench/RESULTS.md session 4). BERTH_CUDA_GEMV_NORM=1..8 turns it on up to that M. */
    be->gemv_norm = env_int(host, "BERTH_CUDA_GEMV_NORM", 0, 8, 1, 0, "0 (off) or the largest M in 1..8");
    /* Off by default: on the H200 the prologue measured slower than the norm's own launch (E2B batch 1: 467 against
     * 482 tok/s, bench/RESULTS.md session 6). BERTH_CUDA_XPRE=1 turns it on, 2 only for products of <= 8192 rows. */
    be->xpre_fuse = env_int(host, "BERTH_CUDA_XPRE", 0, 2, 1, 0, "0, 1 or 2");
    /* Off by default: on the H200 the one-kernel pair measured slower than the two products with their norms as
     * four launches (E2B batch 1: 516-529 against 539-541 tok/s, bench/RESULTS.md session 15). 1 turns it on; 2
     * is strict, for tests (a pair the kernel declines fails instead of running as two products). */
    be->pair = env_int(host, "BERTH_CUDA_PAIR", 0, 2, 1, 0, "0, 1 or 2");
    if (const char *sk = getenv("BERTH_CUDA_SKIP")) { /* an ablation switch (docs/config.md): wrong results */
        static const struct { const char *name; unsigned bit; } names[] = {
            {"ynorm", CU_SKIP_YNORM}, {"rope", CU_SKIP_ROPE}, {"norm", CU_SKIP_NORM},
            {"kv", CU_SKIP_KV},       {"attn", CU_SKIP_ATTN}, {"small", CU_SKIP_SMALL},
            {"kvlocal", CU_SKIP_KVLOCAL}, {"unary", CU_SKIP_UNARY}};
        for (const char *at = sk; *at;) {
            const size_t len = strcspn(at, ",");
            size_t i = 0;
            while (i < sizeof names / sizeof names[0] && !(strlen(names[i].name) == len && !strncmp(at, names[i].name, len)))
                i++;
            if (i < sizeof names / sizeof names[0])
                be->skip |= names[i].bit;
            else if (len)
                cuda_log(host, BERTH_LOG_WARN, "cuda: BERTH_CUDA_SKIP: '%.*s' ignored: ynorm, rope, norm, kv, attn, "
                         "small, unary or kvlocal is expected", (int)len, at);
            at += len + (at[len] == ',');
        }
        if (be->skip)
            cuda_log(host, BERTH_LOG_WARN, "cuda: BERTH_CUDA_SKIP='%s': those ops do nothing, results are wrong "
                     "(an ablation run)", sk);
    }
    be->ck.weight_dtypes = CU_WEIGHT_DTYPES;
    be->ck.act_dtypes = CU_ACT_DTYPES;
    be->ck.kv_dtypes = CU_KV_DTYPES;
    be->ck.attn_max_rep = CU_MAX_REP;
    be->ck.attn_max_head_dim = CU_MAX_HEAD_DIM;
    be->ck.buffer_facts = buffer_facts;
    st = cu_check(be, cudaSetDevice(idx), "cudaSetDevice");
    if (st == BERTH_OK)
        st = cu_check(be, cudaFree(0), "creating the context (cudaFree(0))");
    if (st == BERTH_OK)
        st = cu_cublas_check(be, cublasCreate(&be->cublas), "cublasCreate");
    if (st == BERTH_OK)
        st = cu_cublas_check(be, cublasLtCreate(&be->lt), "cublasLtCreate");
    if (st == BERTH_OK) {
        be->cublas_ws_size = CU_CUBLAS_WS_BYTES;
        st = cu_check(be, cudaMalloc(&be->cublas_ws, be->cublas_ws_size), "cudaMalloc (cuBLAS workspace)");
    }
    if (st == BERTH_OK)
        st = cu_cublas_check(be, cublasSetWorkspace(be->cublas, be->cublas_ws, be->cublas_ws_size),
                             "cublasSetWorkspace");
    if (st != BERTH_OK) {
        cuda_destroy(be);
        return st;
    }
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        (void)cudaGetLastError();
    cuda_log(host, BERTH_LOG_INFO, "cuda device %d: %s, sm_%d%d, %d SMs, %.1f of %.1f GiB free, %s compute", idx,
             prop.name, prop.major, prop.minor, prop.multiProcessorCount, (double)free_b / (1u << 30),
             (double)total_b / (1u << 30), compute == CU_COMPUTE_FP32 ? "fp32" : "bf16");
    *out = be;
    return BERTH_OK;
}

static void cuda_destroy(berth_backend *be)
{
    if (!be)
        return;
    /* Best effort: a lost device still gets its host-side bookkeeping freed; runtime errors here are ignored
     * because destroy cannot report them. */
    (void)cudaSetDevice(be->device);
    while (be->streams) {
        struct berth_stream *s = be->streams;
        be->streams = s->next;
        cu_att_prof_graph_report(be, s);
        stream_free(s);
    }
    while (be->buffers) {
        struct berth_buffer *b = be->buffers;
        be->buffers = b->next;
        if (b->pinned)
            (void)cudaFreeHost(b->ptr);
        else
            (void)cudaFree(b->ptr);
        free(b);
    }
    if (be->cublas)
        (void)cublasDestroy(be->cublas);
    if (be->lt)
        (void)cublasLtDestroy(be->lt);
    if (be->cublas_ws)
        (void)cudaFree(be->cublas_ws);
    (void)cudaGetLastError();
    free(be);
}

// ---------------------------------------------------------------------------------------------------------------
// supports() and the op table. supports() runs the same checks as execution (exec = 0: no buffers), so a model
// the host accepted never meets a parameter refusal at run time.

static berth_status cuda_supports(berth_backend *be, int32_t op, const void *params)
{
    if (!be)
        return cu_fail(NULL, BERTH_E_INVALID, "cuda: supports: backend is NULL");
    if (!params)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: supports: params is NULL");
    struct opck c = {};
    c.exec = 0;
    c.be = &be->ck;
    bool ok;
    switch (op) {
#define CU_SUPPORTS(ID, name, ptype)                                                                           \
    case ID: ok = cu_check_##name(be, &c, (const ptype *)params); break;
        CU_SUPPORTS(BERTH_OP_MATMUL, matmul, berth_matmul_params)
        CU_SUPPORTS(BERTH_OP_GET_ROWS, get_rows, berth_get_rows_params)
        CU_SUPPORTS(BERTH_OP_RMS_NORM, rms_norm, berth_rms_norm_params)
        CU_SUPPORTS(BERTH_OP_LAYER_NORM, layer_norm, berth_layer_norm_params)
        CU_SUPPORTS(BERTH_OP_ROPE, rope, berth_rope_params)
        CU_SUPPORTS(BERTH_OP_UNARY, unary, berth_unary_params)
        CU_SUPPORTS(BERTH_OP_GLU, glu, berth_glu_params)
        CU_SUPPORTS(BERTH_OP_BINARY, binary, berth_binary_params)
        CU_SUPPORTS(BERTH_OP_COPY, copy, berth_copy_params)
        CU_SUPPORTS(BERTH_OP_KV_APPEND, kv_append, berth_kv_append_params)
        CU_SUPPORTS(BERTH_OP_ATTENTION, attention, berth_attention_params)
        CU_SUPPORTS(BERTH_OP_GATED_RMS_NORM, gated_rms_norm, berth_gated_rms_norm_params)
        CU_SUPPORTS(BERTH_OP_LOG_SOFTMAX_TOPK, log_softmax_topk, berth_log_softmax_topk_params)
        CU_SUPPORTS(BERTH_OP_SAMPLE, sample, berth_sample_params)
#undef CU_SUPPORTS
    case BERTH_OP_CONV1D_CAUSAL:
        return cu_fail(be->host, BERTH_E_UNSUPPORTED, "cuda: conv1d_causal is not implemented on CUDA yet");
    case BERTH_OP_GATED_DELTA:
        return cu_fail(be->host, BERTH_E_UNSUPPORTED, "cuda: gated_delta is not implemented on CUDA yet");
    default:
        return cu_fail(be->host, BERTH_E_UNSUPPORTED, "cuda: unknown op %d", (int)op);
    }
    if (ok)
        return BERTH_OK;
    return cu_fail(be->host, BERTH_E_UNSUPPORTED, "%s", c.msg);
}

/* The op table's entries: each counts the call on its stream first (berth_stream.op_seq: an x shadow is valid only
 * for the op right after the one that wrote it, cuda_internal.h). */
#define CU_COUNTED(op, fn, T)                                                                                  \
    static berth_status cu_counted_##op(berth_backend *be, berth_stream *s, const T *p)                        \
    {                                                                                                          \
        if (s)                                                                                                 \
            s->op_seq++;                                                                                       \
        return fn(be, s, p);                                                                                   \
    }
CU_COUNTED(matmul, cu_op_matmul_then_norm, berth_matmul_params)
CU_COUNTED(get_rows, cu_op_get_rows, berth_get_rows_params)
CU_COUNTED(rms_norm, cu_op_rms_norm, berth_rms_norm_params)
CU_COUNTED(layer_norm, cu_op_layer_norm, berth_layer_norm_params)
CU_COUNTED(rope, cu_op_rope, berth_rope_params)
CU_COUNTED(unary, cu_op_unary, berth_unary_params)
CU_COUNTED(glu, cu_op_glu, berth_glu_params)
CU_COUNTED(binary, cu_op_binary, berth_binary_params)
CU_COUNTED(copy, cu_op_copy, berth_copy_params)
CU_COUNTED(kv_append, cu_op_kv_append, berth_kv_append_params)
CU_COUNTED(attention, cu_op_attention, berth_attention_params)
CU_COUNTED(gated_rms_norm, cu_op_gated_rms_norm, berth_gated_rms_norm_params)
CU_COUNTED(log_softmax_topk, cu_op_log_softmax_topk, berth_log_softmax_topk_params)
CU_COUNTED(sample, cu_op_sample, berth_sample_params)

static const berth_ops cuda_ops = {
    .struct_size = BERTH_SIZE_TO(berth_ops, sample),
    .matmul = cu_counted_matmul,
    .get_rows = cu_counted_get_rows,
    .rms_norm = cu_counted_rms_norm,
    .layer_norm = cu_counted_layer_norm,
    .rope = cu_counted_rope,
    .unary = cu_counted_unary,
    .glu = cu_counted_glu,
    .binary = cu_counted_binary,
    .copy = cu_counted_copy,
    .kv_append = cu_counted_kv_append,
    .attention = cu_counted_attention,
    .conv1d_causal = NULL, /* Qwen3.5's recurrent ops: CPU only for now */
    .gated_delta = NULL,
    .gated_rms_norm = cu_counted_gated_rms_norm,
    .log_softmax_topk = cu_counted_log_softmax_topk,
    .sample = cu_counted_sample,
};

static const berth_ops *cuda_get_ops(berth_backend *be)
{
    (void)be;
    return &cuda_ops;
}

// ---------------------------------------------------------------------------------------------------------------
// Streams.

static berth_status cuda_stream_create(berth_backend *be, berth_stream **out)
{
    if (!out)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: stream_create: out is NULL");
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    berth_stream *s = (berth_stream *)calloc(1, sizeof *s);
    if (!s)
        return cu_fail(be->host, BERTH_E_NOMEM, "cuda: stream_create: out of host memory");
    st = cu_check(be, cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    if (st != BERTH_OK) {
        free(s);
        return st;
    }
    /* the GEMV's arrival counter (gemv_norm.cuh) and the decode attention's (attention_decode_mma.cu): zero
     * before any kernel or recording can use them */
    st = cu_check(be, cudaMalloc((void **)&s->ynorm_count, sizeof *s->ynorm_count), "cudaMalloc (stream counter)");
    if (st == BERTH_OK)
        st = cu_check(be, cudaMemsetAsync(s->ynorm_count, 0, sizeof *s->ynorm_count, s->cs), "cudaMemsetAsync");
    if (st == BERTH_OK)
        st = cu_check(be, cudaMalloc((void **)&s->att_count, CU_ATT_COUNTERS * sizeof *s->att_count),
                      "cudaMalloc (stream counters)");
    if (st == BERTH_OK)
        st = cu_check(be, cudaMemsetAsync(s->att_count, 0, CU_ATT_COUNTERS * sizeof *s->att_count, s->cs),
                      "cudaMemsetAsync");
    if (st == BERTH_OK && be->compute == CU_COMPUTE_BF16 && be->xshadow) /* cuda_internal.h: struct cu_xshadow */
        st = cu_check(be, cudaMalloc((void **)&s->xsh_buf, CU_XSH_BYTES), "cudaMalloc (stream x shadow)");
    if (st == BERTH_OK && be->att_prof == CU_ATT_PROF_GRAPH) { /* zero: a stamp never written reads 0 */
        st = cu_check(be, cudaMalloc((void **)&s->gprof, CU_GPROF_STAMPS * sizeof *s->gprof),
                      "cudaMalloc (BERTH_CUDA_ATT_PROF=graph stamps)");
        if (st == BERTH_OK)
            st = cu_check(be, cudaMemsetAsync(s->gprof, 0, CU_GPROF_STAMPS * sizeof *s->gprof, s->cs),
                          "cudaMemsetAsync");
    }
    if (st == BERTH_OK && (be->skip & CU_SKIP_KVLOCAL)) {
        int32_t *h = (int32_t *)malloc(CU_KVLOCAL_ENTRIES * sizeof *h);
        if (!h)
            st = cu_fail(be->host, BERTH_E_NOMEM, "cuda: out of host memory");
        for (int i = 0; h && i < CU_KVLOCAL_ENTRIES; i++)
            h[i] = i % CU_KVLOCAL_BLOCKS;
        if (st == BERTH_OK)
            st = cu_check(be, cudaMalloc((void **)&s->kvlocal_bt, CU_KVLOCAL_ENTRIES * sizeof *h),
                          "cudaMalloc (kvlocal block table)");
        if (st == BERTH_OK)
            st = cu_check(be, cudaMemcpy(s->kvlocal_bt, h, CU_KVLOCAL_ENTRIES * sizeof *h, cudaMemcpyHostToDevice),
                          "cudaMemcpy (kvlocal block table)");
        free(h);
    }
    if (st == BERTH_OK)
        st = cu_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize");
    if (st != BERTH_OK) {
        stream_free(s);
        return st;
    }
    s->next = be->streams;
    if (be->streams)
        be->streams->prev = s;
    be->streams = s;
    *out = s;
    return BERTH_OK;
}

static void cuda_stream_destroy(berth_backend *be, berth_stream *s)
{
    if (!s)
        return;
    (void)cudaSetDevice(be->device);
    if (s->prev)
        s->prev->next = s->next;
    else
        be->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    if (s->pdl_barrier)
        be->pdl_barriers--;
    cu_att_prof_graph_report(be, s);
    stream_free(s);
    (void)cudaGetLastError();
}

static berth_status cuda_stream_sync(berth_backend *be, berth_stream *s)
{
    if (!s)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: stream_sync: stream is NULL");
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    return cu_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize");
}

// Workspaces. Grown, never shrunk: the first steps of a run find the sizes, later ones reuse them. Growing waits for
// the stream so that no queued kernel still uses the old memory.

static berth_status ws_grow(berth_backend *be, berth_stream *s, struct cu_workspace *w, size_t bytes, int pinned)
{
    if (w->size >= bytes)
        return BERTH_OK;
    if (be->capturing)
        return cu_fail(be->host, BERTH_E_INTERNAL,
                       "cuda: a %s workspace of %zu bytes is needed during graph capture (have %zu); run the step once "
                       "before capturing it", pinned ? "host" : "device", bytes, w->size);
    berth_status st = cu_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize (workspace)");
    if (st != BERTH_OK)
        return st;
    size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4; /* room to grow */
    void *p = NULL;
    char what[96];
    snprintf(what, sizeof what, "%s(%zu bytes, workspace)", pinned ? "cudaMallocHost" : "cudaMalloc", want);
    if ((st = cu_check(be, pinned ? cudaMallocHost(&p, want) : cudaMalloc(&p, want), what)) != BERTH_OK)
        return st;
    if (w->ptr && pinned) {
        (void)cudaFreeHost(w->ptr);
    } else if (w->ptr) {
        /* A graph recorded earlier on this stream may use the old scratch whenever it is replayed. */
        struct cu_retired *r = (struct cu_retired *)malloc(sizeof *r);
        if (!r) {
            (void)cudaFree(p);
            return cu_fail(be->host, BERTH_E_NOMEM, "cuda: out of host memory (workspace)");
        }
        r->ptr = w->ptr;
        r->next = s->retired;
        s->retired = r;
    }
    w->ptr = p;
    w->size = want;
    return BERTH_OK;
}

berth_status cu_stream_ws(berth_backend *be, berth_stream *s, size_t bytes, void **out)
{
    berth_status st = ws_grow(be, s, &s->dev, bytes ? bytes : 1, 0);
    *out = st == BERTH_OK ? s->dev.ptr : NULL;
    return st;
}

berth_status cu_stream_host_ws(berth_backend *be, berth_stream *s, size_t bytes, void **out)
{
    *out = NULL;
    berth_status st;
    if (s->host_pending) {
        if ((st = cu_check(be, cudaEventSynchronize(s->host_free), "cudaEventSynchronize (host workspace)")) !=
            BERTH_OK)
            return st;
        s->host_pending = 0;
    }
    if ((st = ws_grow(be, s, &s->host, bytes ? bytes : 1, 1)) != BERTH_OK)
        return st;
    *out = s->host.ptr;
    return BERTH_OK;
}

berth_status cu_stream_host_ws_done(berth_backend *be, berth_stream *s)
{
    berth_status st = BERTH_OK;
    if (!s->host_free)
        st = cu_check(be, cudaEventCreateWithFlags(&s->host_free, cudaEventDisableTiming), "cudaEventCreate");
    if (st == BERTH_OK)
        st = cu_check(be, cudaEventRecord(s->host_free, s->cs), "cudaEventRecord (host workspace)");
    if (st == BERTH_OK)
        s->host_pending = 1;
    return st;
}

// ---------------------------------------------------------------------------------------------------------------
// Buffers and transfers.

static berth_status cuda_buffer_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    if (!out)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: buffer_alloc: out is NULL");
    if (usage < BERTH_USAGE_WEIGHTS || usage > BERTH_USAGE_STAGING)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: buffer_alloc: unknown usage %d", usage);
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    berth_buffer *b = (berth_buffer *)calloc(1, sizeof *b);
    if (!b)
        return cu_fail(be->host, BERTH_E_NOMEM, "cuda: buffer_alloc: out of host memory");
    b->size = nbytes;
    b->usage = usage;
    b->pinned = usage == BERTH_USAGE_STAGING;
    if (nbytes > 0) {
        char what[96];
        snprintf(what, sizeof what, "%s(%llu bytes)", b->pinned ? "cudaMallocHost" : "cudaMalloc",
                 (unsigned long long)nbytes);
        st = cu_check(be, b->pinned ? cudaMallocHost(&b->ptr, nbytes) : cudaMalloc(&b->ptr, nbytes), what);
        if (st != BERTH_OK) {
            free(b);
            return st;
        }
    }
    b->next = be->buffers;
    if (be->buffers)
        be->buffers->prev = b;
    be->buffers = b;
    *out = b;
    return BERTH_OK;
}

static void cuda_buffer_free(berth_backend *be, berth_buffer *b)
{
    if (!b)
        return;
    (void)cudaSetDevice(be->device);
    if (b->pinned)
        (void)cudaFreeHost(b->ptr);
    else
        (void)cudaFree(b->ptr); /* implicitly synchronises the device, so pending work on b finishes first */
    (void)cudaGetLastError();
    if (b->prev)
        b->prev->next = b->next;
    else
        be->buffers = b->next;
    if (b->next)
        b->next->prev = b->prev;
    free(b);
}

/* Staging buffers are pinned host memory: the host may write them directly (runner metadata mirrors). */
static berth_status cuda_buffer_host_ptr(berth_backend *be, berth_buffer *buf, void **out)
{
    if (!buf || !out)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: buffer_host_ptr: buffer or out is NULL");
    if (!buf->pinned)
        return cu_fail(be->host, BERTH_E_UNSUPPORTED,
                       "cuda: buffer_host_ptr: only staging buffers (BERTH_USAGE_STAGING) are host memory");
    *out = buf->ptr;
    return BERTH_OK;
}

/* Common argument checks of the transfer calls: stream present, [offset, offset + nbytes) inside buf. */
static berth_status cuda_check_range(berth_backend *be, const char *call, const berth_stream *s,
                                     const berth_buffer *buf, uint64_t offset, uint64_t nbytes)
{
    if (!s)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: %s: stream is NULL", call);
    if (!buf)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: %s: buffer is NULL", call);
    if (offset > buf->size || nbytes > buf->size - offset)
        return cu_fail(be->host, BERTH_E_INVALID,
                         "cuda: %s: range [%llu, %llu + %llu) is outside the buffer of %llu bytes", call,
                         (unsigned long long)offset, (unsigned long long)offset, (unsigned long long)nbytes,
                         (unsigned long long)buf->size);
    return BERTH_OK;
}

static berth_status cuda_buffer_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                       const void *src, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_upload", s, dst, offset, nbytes);
    if (st != BERTH_OK)
        return st;
    if (nbytes == 0)
        return BERTH_OK;
    if (!src)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: buffer_upload: src is NULL");
    if ((st = cu_enter(be)) != BERTH_OK)
        return st;
    s->xsh.seq = 0; /* cuda_internal.h, struct cu_xshadow: stream work that is no op ends a shadow's life */
    st = cu_check(be, cudaMemcpyAsync((char *)dst->ptr + offset, src, nbytes, cudaMemcpyDefault, s->cs),
                    "cudaMemcpyAsync (upload)");
    if (st != BERTH_OK)
        return st;
    /* The contract: src is read before upload returns. From pageable memory the runtime stages the copy and
     * guarantees that; from pinned memory the DMA may still be reading it, so wait. */
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, src) != cudaSuccess) {
        (void)cudaGetLastError();
        attr.type = cudaMemoryTypeHost; /* unknown: be safe */
    }
    if (attr.type == cudaMemoryTypeHost)
        st = cu_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize (upload from pinned memory)");
    return st;
}

static berth_status cuda_buffer_download(berth_backend *be, berth_stream *s, const berth_buffer *src,
                                         uint64_t offset, void *dst, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_download", s, src, offset, nbytes);
    if (st != BERTH_OK)
        return st;
    if (nbytes == 0)
        return BERTH_OK;
    if (!dst)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: buffer_download: dst is NULL");
    if ((st = cu_enter(be)) != BERTH_OK)
        return st;
    return cu_check(be, cudaMemcpyAsync(dst, (const char *)src->ptr + offset, nbytes, cudaMemcpyDefault, s->cs),
                      "cudaMemcpyAsync (download)");
}

static berth_status cuda_buffer_copy(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t dst_offset,
                                     const berth_buffer *src, uint64_t src_offset, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_copy (dst)", s, dst, dst_offset, nbytes);
    if (st == BERTH_OK)
        st = cuda_check_range(be, "buffer_copy (src)", s, src, src_offset, nbytes);
    if (st != BERTH_OK || nbytes == 0)
        return st;
    if ((st = cu_enter(be)) != BERTH_OK)
        return st;
    s->xsh.seq = 0;
    if (cu_copy_kernel_fits(be, dst, src, nbytes))
        return cu_copy_small(be, s, (char *)dst->ptr + dst_offset, (const char *)src->ptr + src_offset, nbytes);
    return cu_check(be,
                      cudaMemcpyAsync((char *)dst->ptr + dst_offset, (const char *)src->ptr + src_offset, nbytes,
                                      cudaMemcpyDefault, s->cs),
                      "cudaMemcpyAsync (copy)");
}

static berth_status cuda_buffer_fill(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                     uint8_t byte, uint64_t nbytes)
{
    berth_status st = cuda_check_range(be, "buffer_fill", s, dst, offset, nbytes);
    if (st != BERTH_OK || nbytes == 0)
        return st;
    if ((st = cu_enter(be)) != BERTH_OK)
        return st;
    s->xsh.seq = 0;
    if (dst->pinned) {
        /* Staging memory is host memory: keep stream order by waiting for earlier work, then fill on the CPU. */
        st = cu_check(be, cudaStreamSynchronize(s->cs), "cudaStreamSynchronize (fill)");
        if (st == BERTH_OK)
            memset((char *)dst->ptr + offset, byte, nbytes);
        return st;
    }
    return cu_check(be, cudaMemsetAsync((char *)dst->ptr + offset, byte, nbytes, s->cs), "cudaMemsetAsync");
}

// ---------------------------------------------------------------------------------------------------------------
// Graphs: CUDA stream capture. cuBLAS captures fine once its workspace is fixed (init sets it); the ops keep the
// capture rules of cuda_internal.h while be->capturing is set.

struct berth_graph {
    cudaGraphExec_t exec;
};

static berth_status cuda_graph_begin(berth_backend *be, berth_stream *s)
{
    if (!s)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: graph_begin: stream is NULL");
    if (be->capturing)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: graph_begin: a capture is already in progress");
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    s->xsh.seq = 0; /* a captured op must not read a shadow an eager op wrote (nor the reverse, at graph_end) */
    s->gprof_graph++;
    st = cu_check(be, cudaStreamBeginCapture(s->cs, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    if (st == BERTH_OK)
        be->capturing = 1;
    return st;
}

static berth_status cuda_graph_end(berth_backend *be, berth_stream *s, berth_graph **out)
{
    if (!s || !out)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: graph_end: stream or out is NULL");
    if (!be->capturing)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: graph_end: no capture in progress");
    *out = NULL;
    be->capturing = 0;
    s->xsh.seq = 0;
    /* The capture's first kernel took a copy's PDL barrier (cu_launch_cluster); a failed capture is run again
     * eagerly, after that copy: its first kernel must again go without PDL (after a graph it costs nothing). */
    cu_pdl_barrier_set(be, s);
    (void)cudaSetDevice(be->device);
    cudaGraph_t graph = NULL;
    berth_status st = cu_check(be, cudaStreamEndCapture(s->cs, &graph), "cudaStreamEndCapture");
    if (st != BERTH_OK)
        return st;
    berth_graph *g = (berth_graph *)calloc(1, sizeof *g);
    if (!g) {
        (void)cudaGraphDestroy(graph);
        return cu_fail(be->host, BERTH_E_NOMEM, "cuda: graph_end: out of host memory");
    }
    st = cu_check(be, cudaGraphInstantiate(&g->exec, graph, 0), "cudaGraphInstantiate");
    (void)cudaGraphDestroy(graph);
    if (st != BERTH_OK) {
        free(g);
        return st;
    }
    *out = g;
    return BERTH_OK;
}

static berth_status cuda_graph_launch(berth_backend *be, berth_stream *s, berth_graph *g)
{
    if (!s || !g)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: graph_launch: stream or graph is NULL");
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    s->xsh.seq = 0; /* the graph rewrites the shadow buffer and the rows an eager shadow would stand for */
    return cu_check(be, cudaGraphLaunch(g->exec, s->cs), "cudaGraphLaunch");
}

static void cuda_graph_destroy(berth_backend *be, berth_graph *g)
{
    if (!g)
        return;
    (void)cudaSetDevice(be->device);
    (void)cudaGraphExecDestroy(g->exec);
    (void)cudaGetLastError();
    free(g);
}

// ---------------------------------------------------------------------------------------------------------------
// Events: the runner records one after a step's sampled ids are copied to pinned memory and waits on it while the
// next step runs (overlap). No timing: cheaper to record and to wait on.

struct berth_event {
    cudaEvent_t ev;
    int recorded;
};

static berth_status cuda_event_create(berth_backend *be, berth_event **out)
{
    if (!out)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: event_create: out is NULL");
    *out = NULL;
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    berth_event *e = (berth_event *)calloc(1, sizeof *e);
    if (!e)
        return cu_fail(be->host, BERTH_E_NOMEM, "cuda: event_create: out of host memory");
    st = cu_check(be, cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming), "cudaEventCreate");
    if (st != BERTH_OK) {
        free(e);
        return st;
    }
    *out = e;
    return BERTH_OK;
}

static void cuda_event_destroy(berth_backend *be, berth_event *e)
{
    if (!e)
        return;
    (void)cudaSetDevice(be->device);
    (void)cudaEventDestroy(e->ev);
    (void)cudaGetLastError();
    free(e);
}

static berth_status cuda_event_record(berth_backend *be, berth_stream *s, berth_event *e)
{
    if (!s || !e)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: event_record: stream or event is NULL");
    if (be->capturing)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: event_record: not allowed while a graph is being recorded");
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    st = cu_check(be, cudaEventRecord(e->ev, s->cs), "cudaEventRecord");
    if (st == BERTH_OK)
        e->recorded = 1;
    return st;
}

static berth_status cuda_event_sync(berth_backend *be, berth_event *e)
{
    if (!e)
        return cu_fail(be->host, BERTH_E_INVALID, "cuda: event_sync: event is NULL");
    if (!e->recorded)
        return BERTH_OK;
    berth_status st = cu_enter(be);
    if (st != BERTH_OK)
        return st;
    return cu_check(be, cudaEventSynchronize(e->ev), "cudaEventSynchronize");
}

// ---------------------------------------------------------------------------------------------------------------
// Descriptor.

static const berth_backend_vtable cuda_vtable = {
    .struct_size = BERTH_SIZE_TO(berth_backend_vtable, event_sync),
    .probe = cuda_probe,
    .device_info = cuda_device_info,
    .init = cuda_init,
    .destroy = cuda_destroy,
    .supports = cuda_supports,
    .get_ops = cuda_get_ops,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .buffer_wrap_host = NULL, /* no BERTH_CAP_WRAP_HOST: weights are uploaded */
    .buffer_host_ptr = cuda_buffer_host_ptr, /* staging buffers only (no BERTH_CAP_HOST_VISIBLE) */
    .buffer_upload = cuda_buffer_upload,
    .buffer_download = cuda_buffer_download,
    .buffer_copy = cuda_buffer_copy,
    .buffer_fill = cuda_buffer_fill,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_sync = cuda_event_sync,
};

static const berth_plugin_desc cuda_desc = {
    .magic = BERTH_PLUGIN_MAGIC,
    .struct_size = BERTH_SIZE_TO(berth_plugin_desc, vtable),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .kind = BERTH_PLUGIN_BACKEND,
    .name = "cuda",
    .version = "0.2.0",
    .description = "NVIDIA GPUs through the CUDA runtime and cuBLAS",
    .required_services = BERTH_SVC_LOG,
    .vtable = &cuda_vtable,
};

/* The one exported symbol. Pure: no CUDA call here (CUDA is initialised by probe/init). The descriptor is
 * returned whatever the host's version, so the host can name both versions if they disagree. */
extern "C" BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major,
                                                                    uint32_t host_abi_minor)
{
    (void)host_abi_major;
    (void)host_abi_minor;
    return &cuda_desc;
}

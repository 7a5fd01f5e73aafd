/* harness.c — the CPU/CUDA pair behind the CUDA kernel tests (see harness.h). */
#include "harness.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../check_run.h"

struct hx *hx;
char hx_last_error[512];

static struct hx the_pair;
static const char *compute_mode = "fp32";

/* ---- a minimal host ----------------------------------------------------------------------------------------- */

static void h_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx;
    (void)level;
    (void)msg;
}

static void h_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    (void)code;
    snprintf(hx_last_error, sizeof hx_last_error, "%s", msg);
}

/* [backend.cuda] compute for the CUDA side; the CPU side gets no keys (all defaults). */
static const char *cuda_config_get(berth_host_ctx *ctx, const char *key)
{
    (void)ctx;
    return strcmp(key, "compute") == 0 ? compute_mode : NULL;
}

static const char *cpu_config_get(berth_host_ctx *ctx, const char *key)
{
    (void)ctx;
    /* Two threads: the reference does not need to be fast, and the machine may be shared. */
    return strcmp(key, "threads") == 0 ? "2" : NULL;
}

static berth_status h_config_at(berth_host_ctx *ctx, int32_t idx, const char **key, const char **value)
{
    (void)ctx;
    (void)idx;
    *key = *value = NULL;
    return BERTH_E_NOT_FOUND;
}

static berth_host hosts[2];

static void make_host(berth_host *h, const char *(*get)(berth_host_ctx *, const char *))
{
    memset(h, 0, sizeof *h);
    h->struct_size = (uint32_t)BERTH_SIZE_TO(berth_host, config_at);
    h->abi_major = BERTH_ABI_MAJOR;
    h->abi_minor = BERTH_ABI_MINOR;
    h->host_version = "cuda-ops-test";
    h->services = BERTH_SVC_LOG | BERTH_SVC_CONFIG;
    h->log = h_log;
    h->set_error = h_set_error;
    h->config_get = get;
    h->config_at = h_config_at;
}

static void die(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    exit(1);
}

/* Load one backend plugin; returns its device count (probe) and opens device 0 when there is one. */
static int open_side(struct hx_side *side, const char *path, berth_host *host)
{
    void *so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!so)
        die("dlopen %s: %s", path, dlerror());
    berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(so, BERTH_PLUGIN_ENTRY_SYMBOL);
    if (!entry)
        die("%s: no %s", path, BERTH_PLUGIN_ENTRY_SYMBOL);
    const berth_plugin_desc *d = entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    side->vt = (const berth_backend_vtable *)d->vtable;
    berth_probe_info pi;
    memset(&pi, 0, sizeof pi);
    pi.struct_size = sizeof pi;
    if (side->vt->probe(host, &pi) != BERTH_OK)
        die("%s: probe failed: %s", path, hx_last_error);
    if (pi.n_devices < 1) {
        snprintf(hx_last_error, sizeof hx_last_error, "%s", pi.message);
        return 0;
    }
    if (side->vt->init(host, 0, &side->be) != BERTH_OK)
        die("%s: init failed: %s", path, hx_last_error);
    side->ops = side->vt->get_ops(side->be);
    if (side->vt->stream_create(side->be, &side->s) != BERTH_OK)
        die("%s: stream_create failed: %s", path, hx_last_error);
    return pi.n_devices;
}

/* ---- random numbers (splitmix64) ----------------------------------------------------------------------------- */

static uint64_t rng_state;

uint64_t hx_rand_u64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float hx_rand_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(hx_rand_u64() >> 11) * 0x1.0p-53);
}

/* ---- dtype conversions on the host -------------------------------------------------------------------------- */

static size_t dt_size(berth_dtype dt)
{
    switch (dt) {
    case BERTH_DTYPE_F16:
    case BERTH_DTYPE_BF16: return 2;
    case BERTH_DTYPE_I64: return 8;
    case BERTH_DTYPE_U8: return 1;
    default: return 4;
    }
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

static float f16_to_f32(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, 2);
    return (float)h;
}

/* ---- tensors ------------------------------------------------------------------------------------------------ */

struct hx_tensor hx_new(berth_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3)
{
    return hx_new_usage(dt, BERTH_USAGE_ACTIVATIONS, ne0, ne1, ne2, ne3);
}

struct hx_tensor hx_new_usage(berth_dtype dt, int32_t usage, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3)
{
    struct hx_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    int64_t ne[4] = {ne0 ? ne0 : 1, ne1 ? ne1 : 1, ne2 ? ne2 : 1, ne3 ? ne3 : 1};
    memcpy(t.ne, ne, sizeof ne);
    const size_t es = dt_size(dt);
    t.bytes = (uint64_t)(ne[0] * ne[1] * ne[2] * ne[3]) * es;
    for (int s = 0; s < 2; s++) {
        struct hx_side *side = &hx->side[s];
        ck_assert_msg(side->vt->buffer_alloc(side->be, t.bytes, usage, &t.buf[s]) == BERTH_OK,
                      "buffer_alloc(%" PRIu64 ") on side %d: %s", t.bytes, s, hx_last_error);
        ck_assert(side->vt->buffer_fill(side->be, side->s, t.buf[s], 0, 0xFF, t.bytes) == BERTH_OK);
        berth_tensor *bt = &t.t[s];
        memset(bt, 0, sizeof *bt);
        bt->buf = t.buf[s];
        bt->dtype = dt;
        memcpy(bt->ne, ne, sizeof ne);
        bt->nb[0] = (int64_t)es;
        for (int i = 1; i < 4; i++)
            bt->nb[i] = bt->nb[i - 1] * ne[i - 1];
    }
    return t;
}

void hx_free(struct hx_tensor *t)
{
    for (int s = 0; s < 2; s++) {
        if (t->buf[s]) {
            hx->side[s].vt->stream_sync(hx->side[s].be, hx->side[s].s);
            hx->side[s].vt->buffer_free(hx->side[s].be, t->buf[s]);
        }
        t->buf[s] = NULL;
    }
}

void hx_set(struct hx_tensor *t, const void *data)
{
    for (int s = 0; s < 2; s++) {
        struct hx_side *side = &hx->side[s];
        ck_assert_msg(side->vt->buffer_upload(side->be, side->s, t->buf[s], 0, data, t->bytes) == BERTH_OK,
                      "upload on side %d: %s", s, hx_last_error);
        ck_assert(side->vt->stream_sync(side->be, side->s) == BERTH_OK);
    }
}

void hx_get(const struct hx_tensor *t, int s, void *out)
{
    struct hx_side *side = &hx->side[s];
    ck_assert_msg(side->vt->buffer_download(side->be, side->s, t->buf[s], 0, out, t->bytes) == BERTH_OK,
                  "download on side %d: %s", s, hx_last_error);
    ck_assert_msg(side->vt->stream_sync(side->be, side->s) == BERTH_OK, "sync on side %d: %s", s, hx_last_error);
}

static int64_t n_elems(const struct hx_tensor *t)
{
    return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

void hx_get_f32(const struct hx_tensor *t, int s, float *out)
{
    const int64_t n = n_elems(t);
    void *raw = malloc(t->bytes);
    ck_assert_ptr_nonnull(raw);
    hx_get(t, s, raw);
    for (int64_t i = 0; i < n; i++) {
        switch (t->dtype) {
        case BERTH_DTYPE_BF16: out[i] = bf16_to_f32(((const uint16_t *)raw)[i]); break;
        case BERTH_DTYPE_F16: out[i] = f16_to_f32(((const uint16_t *)raw)[i]); break;
        case BERTH_DTYPE_I32: out[i] = (float)((const int32_t *)raw)[i]; break;
        default: out[i] = ((const float *)raw)[i]; break;
        }
    }
    free(raw);
}

void hx_rand(struct hx_tensor *t, float lo, float hi)
{
    const int64_t n = n_elems(t);
    void *raw = malloc(t->bytes);
    ck_assert_ptr_nonnull(raw);
    for (int64_t i = 0; i < n; i++) {
        float v = hx_rand_uniform(lo, hi);
        switch (t->dtype) {
        case BERTH_DTYPE_BF16: ((uint16_t *)raw)[i] = f32_to_bf16(v); break;
        case BERTH_DTYPE_F16: ((uint16_t *)raw)[i] = f32_to_f16(v); break;
        case BERTH_DTYPE_I32: ((int32_t *)raw)[i] = (int32_t)floorf(v); break;
        default: ((float *)raw)[i] = v; break;
        }
    }
    hx_set(t, raw);
    free(raw);
}

void hx_rand_int(struct hx_tensor *t, int32_t lo, int32_t hi)
{
    ck_assert_int_eq(t->dtype, BERTH_DTYPE_I32);
    const int64_t n = n_elems(t);
    int32_t *v = malloc((size_t)n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (int32_t)(hx_rand_u64() % (uint64_t)(hi - lo + 1));
    hx_set(t, v);
    free(v);
}

/* ---- ops ------------------------------------------------------------------------------------------------------ */

berth_status hx_op(int s, int32_t op, const void *params)
{
    struct hx_side *side = &hx->side[s];
    const berth_ops *o = side->ops;
    berth_backend *be = side->be;
    berth_stream *st = side->s;
    hx_last_error[0] = '\0';
    switch (op) {
    case BERTH_OP_MATMUL: return o->matmul(be, st, params);
    case BERTH_OP_GET_ROWS: return o->get_rows(be, st, params);
    case BERTH_OP_RMS_NORM: return o->rms_norm(be, st, params);
    case BERTH_OP_LAYER_NORM: return o->layer_norm(be, st, params);
    case BERTH_OP_ROPE: return o->rope(be, st, params);
    case BERTH_OP_UNARY: return o->unary(be, st, params);
    case BERTH_OP_GLU: return o->glu(be, st, params);
    case BERTH_OP_BINARY: return o->binary(be, st, params);
    case BERTH_OP_COPY: return o->copy(be, st, params);
    case BERTH_OP_KV_APPEND: return o->kv_append(be, st, params);
    case BERTH_OP_ATTENTION: return o->attention(be, st, params);
    case BERTH_OP_GATED_RMS_NORM: return o->gated_rms_norm(be, st, params);
    case BERTH_OP_LOG_SOFTMAX_TOPK: return o->log_softmax_topk(be, st, params);
    case BERTH_OP_SAMPLE: return o->sample(be, st, params);
    default: ck_abort_msg("hx_op: op %d is not wired", (int)op);
    }
    return BERTH_E_INTERNAL;
}

berth_status hx_supports(int s, int32_t op, const void *params)
{
    hx_last_error[0] = '\0';
    return hx->side[s].vt->supports(hx->side[s].be, op, params);
}

void hx_sync(void)
{
    for (int s = 0; s < 2; s++)
        ck_assert_msg(hx->side[s].vt->stream_sync(hx->side[s].be, hx->side[s].s) == BERTH_OK, "sync side %d: %s", s,
                      hx_last_error);
}

double hx_expect_close(const struct hx_tensor *t, double atol, double rtol, const char *what)
{
    const int64_t n = n_elems(t);
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    ck_assert(a && b);
    hx_get_f32(t, HX_CPU, a);
    hx_get_f32(t, HX_GPU, b);
    double worst = 0.0;
    int64_t worst_i = -1, first_bad = -1;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) {
            if (first_bad < 0)
                first_bad = i;
            continue;
        }
        double d = fabs((double)b[i] - (double)a[i]);
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
        if (d > atol + rtol * fabs((double)a[i]) && first_bad < 0)
            first_bad = i;
    }
    if (first_bad >= 0) {
        char msg[400];
        snprintf(msg, sizeof msg,
                 "%s: element %" PRId64 " of %" PRId64 ": cpu %.9g gpu %.9g (atol %g rtol %g); largest |diff| %.3g at "
                 "%" PRId64 " (seed %" PRIu64 ")",
                 what, first_bad, n, (double)a[first_bad], (double)b[first_bad], atol, rtol, worst, worst_i,
                 hx->seed);
        free(a);
        free(b);
        ck_abort_msg("%s", msg);
    }
    free(a);
    free(b);
    return worst;
}

void hx_expect_equal(const struct hx_tensor *t, const char *what)
{
    unsigned char *a = malloc(t->bytes), *b = malloc(t->bytes);
    ck_assert(a && b);
    hx_get(t, HX_CPU, a);
    hx_get(t, HX_GPU, b);
    const size_t es = dt_size(t->dtype);
    for (uint64_t i = 0; i < t->bytes; i += es) {
        if (memcmp(a + i, b + i, es) != 0) {
            int32_t va = 0, vb = 0;
            memcpy(&va, a + i, es < 4 ? es : 4);
            memcpy(&vb, b + i, es < 4 ? es : 4);
            free(a);
            free(b);
            ck_abort_msg("%s: element %" PRIu64 " differs: cpu %d gpu %d (seed %" PRIu64 ")", what, i / es, (int)va,
                         (int)vb, hx->seed);
        }
    }
    free(a);
    free(b);
}

/* ---- main --------------------------------------------------------------------------------------------------- */

int hx_main(int argc, char **argv, Suite *(*make_suite)(void))
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s CPU_PLUGIN.so CUDA_PLUGIN.so\n", argv[0]);
        return 2;
    }
    const char *mode = getenv("HX_COMPUTE");
    if (mode && *mode)
        compute_mode = mode;
    hx = &the_pair;
    const char *seed = getenv("HX_SEED");
    hx->seed = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    rng_state = hx->seed;
    make_host(&hosts[HX_GPU], cuda_config_get);
    make_host(&hosts[HX_CPU], cpu_config_get);
    /* The CUDA side first: without a device there is nothing to test. */
    if (open_side(&hx->side[HX_GPU], argv[2], &hosts[HX_GPU]) == 0) {
        printf("no CUDA device: skipped (%s)\n", hx_last_error);
        return 77;
    }
    if (open_side(&hx->side[HX_CPU], argv[1], &hosts[HX_CPU]) == 0)
        die("%s: the CPU backend reports no device%s", argv[1], "");
    printf("seed %" PRIu64 " (HX_SEED=%" PRIu64 " repeats this run), CUDA compute %s\n", hx->seed, hx->seed,
           compute_mode);
    fflush(stdout);
    const int failed = check_run(make_suite(), 1); /* never forked: CUDA must not cross a fork */
    for (int s = 0; s < 2; s++) {
        hx->side[s].vt->stream_destroy(hx->side[s].be, hx->side[s].s);
        hx->side[s].vt->destroy(hx->side[s].be);
    }
    return failed ? 1 : 0;
}

int64_t hx_dtype_size(berth_dtype dt)
{
    return dt == BERTH_DTYPE_F16 || dt == BERTH_DTYPE_BF16 ? 2 : 4;
}

const char *hx_dtype_name(berth_dtype dt)
{
    switch (dt) {
    case BERTH_DTYPE_F32: return "f32";
    case BERTH_DTYPE_F16: return "f16";
    case BERTH_DTYPE_BF16: return "bf16";
    case BERTH_DTYPE_I32: return "i32";
    default: return "?";
    }
}

berth_tensor hx_view(const struct hx_tensor *t, int side, int64_t off, int64_t ne0, int64_t ne1, int64_t ne2,
                     int64_t ne3, int64_t nb1, int64_t nb2, int64_t nb3)
{
    berth_tensor v = t->t[side];
    const int64_t es = hx_dtype_size(t->dtype);
    v.offset += (uint64_t)(off * es);
    v.ne[0] = ne0;
    v.ne[1] = ne1;
    v.ne[2] = ne2;
    v.ne[3] = ne3;
    v.nb[0] = es;
    v.nb[1] = nb1 * es;
    v.nb[2] = nb2 * es;
    v.nb[3] = nb3 * es;
    return v;
}

void hx_run_both(int32_t op, const void *p_cpu, const void *p_gpu, const char *what)
{
    berth_status st = hx_op(HX_CPU, op, p_cpu);
    ck_assert_msg(st == BERTH_OK, "%s: cpu op failed (%d): %s", what, (int)st, hx_last_error);
    st = hx_op(HX_GPU, op, p_gpu);
    ck_assert_msg(st == BERTH_OK, "%s: cuda op failed (%d): %s", what, (int)st, hx_last_error);
    hx_sync();
}

void hx_scale_both(const struct hx_tensor *t, float k, const char *what)
{
    berth_unary_params p[2];
    for (int s = 0; s < 2; s++) {
        memset(&p[s], 0, sizeof p[s]);
        p[s].struct_size = sizeof p[s];
        p[s].act = BERTH_ACT_IDENTITY;
        p[s].in_scale = 1.0f;
        p[s].out_scale = k;
        p[s].x = t->t[s];
        p[s].y = t->t[s];
    }
    hx_run_both(BERTH_OP_UNARY, &p[HX_CPU], &p[HX_GPU], what);
}

/*
 * test_cpu_harness.c — shared by the CPU backend tests (see test_cpu_harness.h): the host table, plugin loading,
 * the per-test backend, random inputs, test tensors and comparison helpers.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "test_cpu_harness.h"
#include "check_run.h"

/* ---------------------------------------------------------------------------------------------------------------
 * Harness: host table, plugin, backend. */

uint64_t g_seed;
uint64_t g_rng;
char g_threads[16] = "3"; /* odd on purpose: uneven splits */
char g_isa[16] = "";      /* [backend.cpu] isa: "" = absent (auto) */
char g_last_error[512];
berth_status g_last_code;

static void host_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx;
    (void)level;
    (void)msg;
}
static void host_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    g_last_code = code;
    snprintf(g_last_error, sizeof g_last_error, "%s", msg);
}
static const char *host_config_get(berth_host_ctx *ctx, const char *key)
{
    (void)ctx;
    if (strcmp(key, "isa") == 0)
        return g_isa[0] ? g_isa : NULL;
    return strcmp(key, "threads") == 0 ? g_threads : NULL;
}

berth_host g_host = {
    .struct_size = sizeof(berth_host),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .host_version = "test",
    .services = BERTH_SVC_LOG | BERTH_SVC_CONFIG,
    .log = host_log,
    .set_error = host_set_error,
    .config_get = host_config_get,
};

const berth_plugin_desc *g_desc;
berth_plugin_entry_fn g_entry;
const berth_backend_vtable *vt;
const berth_ops *ops;
berth_backend *be;
berth_stream *st;


const berth_plugin_desc *load_plugin(void)
{
    const char *root = getenv("BERTH_BUILD_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/plugins/berth-backend-cpu.so", root ? root : ".");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(h != NULL, "dlopen %s: %s", path, dlerror());
    berth_plugin_entry_fn entry = (berth_plugin_entry_fn)dlsym(h, BERTH_PLUGIN_ENTRY_SYMBOL);
    ck_assert_msg(entry != NULL, "no %s in %s", BERTH_PLUGIN_ENTRY_SYMBOL, path);
    g_entry = entry;
    const berth_plugin_desc *d = entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    ck_assert_ptr_nonnull(d);
    return d;
}

void setup(void)
{
    g_rng = g_seed;
    g_desc = load_plugin();
    vt = g_desc->vtable;
    ck_assert_int_eq(vt->init(&g_host, 0, &be), BERTH_OK);
    ops = vt->get_ops(be);
    ck_assert_int_eq(vt->stream_create(be, &st), BERTH_OK);
}

void teardown(void)
{
    vt->stream_destroy(be, st);
    vt->destroy(be);
    be = NULL;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Random numbers and dtype conversions (independent of the plugin's). */

uint64_t rng_next(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
double urand(double lo, double hi)
{
    return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1p-53;
}
int irand(int lo, int hi) /* [lo, hi] */
{
    return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
float bf16_f(uint16_t h)
{
    return bits_f((uint32_t)h << 16);
}
/* f32 -> bf16, nearest even, by comparing the two neighbours (truncated and one ulp further out) in double. */
uint16_t f_bf16(float f)
{
    if (isnan(f))
        return 0x7fc0;
    const uint16_t lo = (uint16_t)(f_bits(f) >> 16);
    if ((f_bits(f) & 0xffff) == 0)
        return lo;
    const uint16_t hi = (uint16_t)(lo + 1);
    const double vh = isinf(bf16_f(hi)) ? copysign(ldexp(1.0, 128), f) : bf16_f(hi); /* inf sits at 2^128 */
    const double dl = fabs((double)f - bf16_f(lo)), dh = fabs((double)f - vh);
    if (dl < dh)
        return lo;
    if (dh < dl)
        return hi;
    return (lo & 1) ? hi : lo;
}
float f16_f(uint16_t h)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
uint16_t f_f16(float f)
{
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}

/* ---------------------------------------------------------------------------------------------------------------
 * Test tensors: a backend buffer holding one view, with optional padding (strided views, non-zero offset). */


size_t dt_size(berth_dtype d)
{
    return d == BERTH_DTYPE_F32 || d == BERTH_DTYPE_I32 ? 4 : d == BERTH_DTYPE_I64 ? 8 : d == BERTH_DTYPE_U8 ? 1 : 2;
}

/* A tensor of ne with `pad` extra elements after each dimension (0: packed) and pad elements of offset. */
struct tt tt_new(berth_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, int pad)
{
    struct tt x;
    memset(&x, 0, sizeof x);
    const size_t es = dt_size(dt);
    x.t.dtype = dt;
    x.t.ndim = 4;
    x.t.ne[0] = ne0;
    x.t.ne[1] = ne1;
    x.t.ne[2] = ne2;
    x.t.ne[3] = ne3;
    x.t.nb[0] = (int64_t)es;
    x.t.nb[1] = (int64_t)es * (ne0 + pad);
    x.t.nb[2] = x.t.nb[1] * ne1 + (int64_t)es * pad;
    x.t.nb[3] = x.t.nb[2] * ne2 + (int64_t)es * pad;
    x.t.offset = (uint64_t)es * (uint64_t)pad;
    x.bytes = x.t.offset + (size_t)x.t.nb[3] * (size_t)ne3 + es * (size_t)pad;
    ck_assert_int_eq(vt->buffer_alloc(be, x.bytes, BERTH_USAGE_ACTIVATIONS, &x.buf), BERTH_OK);
    void *p;
    ck_assert_int_eq(vt->buffer_host_ptr(be, x.buf, &p), BERTH_OK);
    x.host = p;
    for (size_t i = 0; i < x.bytes; i++) /* garbage in the padding */
        x.host[i] = (char)rng_next();
    x.t.buf = x.buf;
    return x;
}
void tt_free(struct tt *x)
{
    vt->buffer_free(be, x->buf);
    free(x->shadow);
    x->buf = NULL;
}

/* A view on another tensor's buffer: same buffer, given offset (bytes), ne and nb. */
berth_tensor view_of(const struct tt *base, berth_dtype dt, uint64_t offset, const int64_t ne[4],
                            const int64_t nb[4])
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.buf = base->buf;
    t.offset = base->t.offset + offset;
    t.dtype = dt;
    t.ndim = 4;
    memcpy(t.ne, ne, sizeof t.ne);
    memcpy(t.nb, nb, sizeof t.nb);
    return t;
}

char *tptr(const berth_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    void *p;
    vt->buffer_host_ptr(be, t->buf, &p);
    return (char *)p + t->offset + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}
double tget(const berth_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    const char *p = tptr(t, i0, i1, i2, i3);
    switch (t->dtype) {
    case BERTH_DTYPE_F32: { float f; memcpy(&f, p, 4); return f; }
    case BERTH_DTYPE_BF16: { uint16_t h; memcpy(&h, p, 2); return bf16_f(h); }
    case BERTH_DTYPE_F16: { uint16_t h; memcpy(&h, p, 2); return f16_f(h); }
    case BERTH_DTYPE_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    default: ck_abort_msg("tget: dtype %d", t->dtype); return 0;
    }
}
/* Store v (rounded to the dtype by the test's own conversions). */
void tset(const berth_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v)
{
    char *p = tptr(t, i0, i1, i2, i3);
    switch (t->dtype) {
    case BERTH_DTYPE_F32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case BERTH_DTYPE_BF16: { uint16_t h = f_bf16((float)v); memcpy(p, &h, 2); break; }
    case BERTH_DTYPE_F16: { uint16_t h = f_f16((float)v); memcpy(p, &h, 2); break; }
    case BERTH_DTYPE_I32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
    default: ck_abort_msg("tset: dtype %d", t->dtype);
    }
}

void trand(const berth_tensor *t, double lo, double hi)
{
    FOR_EACH(t, a, b, c, d) tset(t, a, b, c, d, urand(lo, hi));
}
/* NaN in every element of an output view. */
void tpoison(const berth_tensor *t)
{
    FOR_EACH(t, a, b, c, d) tset(t, a, b, c, d, NAN);
}
/* Remember the whole buffer of x to check later that only its view changed. */
void tsnap(struct tt *x)
{
    free(x->shadow);
    x->shadow = malloc(x->bytes);
    memcpy(x->shadow, x->host, x->bytes);
}
/* Every byte of x's buffer outside view t is unchanged since tsnap. */
void tcheck_outside(const struct tt *x, const berth_tensor *t, const char *what)
{
    unsigned char *in = calloc(x->bytes, 1);
    const size_t es = dt_size(t->dtype);
    FOR_EACH(t, a, b, c, d) memset(in + (tptr(t, a, b, c, d) - x->host), 1, es);
    for (size_t i = 0; i < x->bytes; i++)
        CHECK(in[i] || (unsigned char)x->host[i] == x->shadow[i], "%s: byte %zu outside the output view changed",
              what, i);
    free(in);
}

/* |got - ref| <= atol + rtol * scale, and got is a number (NaN = not written). */
void check_close(double got, double ref, double scale, double rtol, const char *what, int64_t i0, int64_t i1,
                        int64_t i2, int64_t i3)
{
    const double atol = 1e-6;
    CHECK(!isnan(got), "%s[%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] not written (NaN)", what, i0, i1, i2, i3);
    CHECK(fabs(got - ref) <= atol + rtol * scale,
          "%s[%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] = %.9g, reference %.9g (scale %.3g)", what, i0, i1, i2,
          i3, got, ref, scale);
}

/* A host-visible i32 vector tensor with given values. */
struct tt ivec(const int32_t *v, int64_t n)
{
    struct tt x = tt_new(BERTH_DTYPE_I32, n, 1, 1, 1, 0);
    for (int64_t i = 0; i < n; i++)
        tset(&x.t, i, 0, 0, 0, v[i]);
    return x;
}

const berth_dtype wdts[3] = {BERTH_DTYPE_F32, BERTH_DTYPE_BF16, BERTH_DTYPE_F16};
const char *dtn(berth_dtype d)
{
    return d == BERTH_DTYPE_F32 ? "f32" : d == BERTH_DTYPE_BF16 ? "bf16" : d == BERTH_DTYPE_F16 ? "f16" : "i32";
}
const berth_tensor absent = {0}; /* buf NULL, all zero */

void expect_error(berth_status got, berth_status code, const char *msg)
{
    CHECK(got == code, "expected status %d, got %d (%s)", code, got, g_last_error);
    CHECK(strcmp(g_last_error, msg) == 0, "message\n  got:      '%s'\n  expected: '%s'", g_last_error, msg);
}

/* Values of a view in FOR_EACH order (caller frees). */
double *tload(const berth_tensor *t)
{
    double *v = malloc(sizeof(double) * (size_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]));
    size_t i = 0;
    FOR_EACH(t, a, b, c, d) v[i++] = tget(t, a, b, c, d);
    return v;
}

double act_ref(int act, double x)
{
    switch (act) {
    case BERTH_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case BERTH_ACT_GELU_ERF: return 0.5 * x * (1 + erf(x / sqrt(2)));
    case BERTH_ACT_SILU: return x / (1 + exp(-x));
    case BERTH_ACT_RELU: return x > 0 ? x : 0;
    case BERTH_ACT_SIGMOID: return 1 / (1 + exp(-x));
    case BERTH_ACT_TANH: return tanh(x);
    case BERTH_ACT_SOFTPLUS: return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
    case BERTH_ACT_EXP: return exp(x);
    default: return x;
    }
}

int cpu_test_run(const char *name, void (*add_tests)(TCase *tc))
{
    const char *env = getenv("BERTH_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
    printf("%s: seed %" PRIu64 " (set BERTH_TEST_SEED to repeat)\n", name, g_seed);
    Suite *s = suite_create(name);
    TCase *tc = tcase_create("ops");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    add_tests(tc);
    suite_add_tcase(s, tc);
    return check_run(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

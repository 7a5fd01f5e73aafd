/*
 * test_cpu_harness.h — what the CPU backend tests (test_cpu_*.c) share.
 *
 * The plugin is dlopen'ed from $BERTH_BUILD_ROOT/plugins/berth-backend-cpu.so with a minimal host table built
 * here (log, set_error, config_get). Every op is compared with a reference written in the tests in double
 * precision on fresh random inputs (the seed comes from the clock, or BERTH_TEST_SEED, and is printed with
 * every failure), with odd sizes, strided views, every allowed dtype, and outputs poisoned with NaN beforehand so
 * an element the op forgot to write fails. Bytes of a buffer outside an output view must stay untouched.
 */
#ifndef TEST_CPU_HARNESS_H
#define TEST_CPU_HARNESS_H

#include <check.h>
#include <inttypes.h>
#include <stdint.h>

#include <berth/backend.h>

/* ---- the plugin and the backend of the running test (setup/teardown are the checked fixture) ---- */
extern uint64_t g_seed;        /* printed with every CHECK failure */
extern uint64_t g_rng;         /* reset to g_seed by setup */
extern char g_threads[16];     /* [backend.cpu] threads the host table answers ("3": uneven splits) */
extern char g_isa[16];         /* [backend.cpu] isa ("" = absent) */
extern char g_last_error[512]; /* the last set_error message */
extern berth_status g_last_code;
extern berth_host g_host;
extern const berth_plugin_desc *g_desc;
extern berth_plugin_entry_fn g_entry;
extern const berth_backend_vtable *vt;
extern const berth_ops *ops;
extern berth_backend *be;
extern berth_stream *st;

void setup(void);
void teardown(void);
/* Build a suite of one test case (fixture: setup/teardown) with add_tests, run it, return the exit status. */
int cpu_test_run(const char *name, void (*add_tests)(TCase *tc));

#define CHECK(cond, fmt, ...) ck_assert_msg((cond), "[seed %" PRIu64 "] " fmt, g_seed, ##__VA_ARGS__)

/* ---- random numbers and dtype conversions (independent of the plugin's) ---- */
uint64_t rng_next(void);
double urand(double lo, double hi);
int irand(int lo, int hi); /* [lo, hi] */
float bits_f(uint32_t u);
uint32_t f_bits(float f);
float bf16_f(uint16_t h);
uint16_t f_bf16(float f); /* nearest even, by comparing the two neighbours */
float f16_f(uint16_t h);  /* through the compiler's _Float16 */
uint16_t f_f16(float f);
size_t dt_size(berth_dtype d);
const char *dtn(berth_dtype d);
extern const berth_dtype wdts[3]; /* f32, bf16, f16 */
extern const berth_tensor absent;  /* an absent optional tensor */

/* ---- test tensors: a backend buffer holding one view ---- */
struct tt {
    berth_tensor t;
    berth_buffer *buf;
    char *host;
    size_t bytes;
    unsigned char *shadow; /* snapshot for the "outside the view untouched" check */
};

/* A tensor of ne with `pad` extra elements after each dimension (0: packed) and pad elements of offset; the
 * whole buffer starts as random bytes. */
struct tt tt_new(berth_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, int pad);
void tt_free(struct tt *x);
/* A view on another tensor's buffer: same buffer, given offset (bytes from base's view), ne and nb. */
berth_tensor view_of(const struct tt *base, berth_dtype dt, uint64_t offset, const int64_t ne[4], const int64_t nb[4]);
char *tptr(const berth_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
double tget(const berth_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
void tset(const berth_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, double v); /* rounds to dtype */
#define FOR_EACH(t, i0, i1, i2, i3)                                                                              \
    for (int64_t i3 = 0; i3 < (t)->ne[3]; i3++)                                                                  \
        for (int64_t i2 = 0; i2 < (t)->ne[2]; i2++)                                                              \
            for (int64_t i1 = 0; i1 < (t)->ne[1]; i1++)                                                          \
                for (int64_t i0 = 0; i0 < (t)->ne[0]; i0++)
void trand(const berth_tensor *t, double lo, double hi);
void tpoison(const berth_tensor *t); /* NaN in every element */
double *tload(const berth_tensor *t); /* values in FOR_EACH order; caller frees */
void tsnap(struct tt *x);             /* remember x's whole buffer ... */
void tcheck_outside(const struct tt *x, const berth_tensor *t, const char *what); /* ... only view t changed */
struct tt ivec(const int32_t *v, int64_t n); /* an i32 vector */

/* |got - ref| <= 1e-6 + rtol * scale, and got is a number (NaN = not written). */
void check_close(double got, double ref, double scale, double rtol, const char *what, int64_t i0, int64_t i1,
                 int64_t i2, int64_t i3);
/* The call returned code and set exactly msg. */
void expect_error(berth_status got, berth_status code, const char *msg);
/* BERTH_ACT_* in double. */
double act_ref(int act, double x);

#endif

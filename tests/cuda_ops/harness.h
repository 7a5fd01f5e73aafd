/*
 * harness.h — kernel tests of the CUDA backend against the CPU backend, both loaded through their descriptors.
 *
 * Every tensor of a test exists twice (t[HX_CPU], t[HX_GPU]) with the same contents; a test builds the op's
 * params once per side, runs the op on both, and compares the outputs. Inputs are fresh random numbers every run
 * (the seed is printed; HX_SEED=N repeats a run); outputs start poisoned (NaN bytes) so an element a kernel
 * forgot to write fails the comparison.
 *
 * A test program: int main(int argc, char **argv) { return hx_main(argc, argv, make_suite); } with argv[1] the
 * CPU plugin and argv[2] the CUDA plugin. Exit 77 (skipped) when the CUDA plugin sees no device. check runs with
 * CK_FORK=no: CUDA must not be used across fork().
 */
#ifndef BERTH_TEST_CUDA_HARNESS_H
#define BERTH_TEST_CUDA_HARNESS_H

#include <berth/backend.h>
#include <check.h>
#include <stdint.h>

#define HX_CPU 0
#define HX_GPU 1

struct hx_side {
    const berth_backend_vtable *vt;
    const berth_ops *ops;
    berth_backend *be;
    berth_stream *s;
};

struct hx {
    struct hx_side side[2];
    uint64_t seed;
};

/* The process-wide pair of backends (opened by hx_main before the suite runs). CUDA in `compute` mode
 * (HX_COMPUTE env: fp32 (default) or bf16). */
extern struct hx *hx;

struct hx_tensor {
    berth_tensor t[2];
    berth_buffer *buf[2];
    berth_dtype dtype;
    int64_t ne[4];
    uint64_t bytes;
};

/* A contiguous tensor (ne[i] = 0 means 1) on both sides, poisoned with 0xFF bytes (NaN in f32/bf16/f16). */
struct hx_tensor hx_new(berth_dtype dt, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
/* The same in a buffer of another usage (BERTH_USAGE_WEIGHTS: kernels may read it before their PDL wait). */
struct hx_tensor hx_new_usage(berth_dtype dt, int32_t usage, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
void hx_free(struct hx_tensor *t);
/* Uniform random values in [lo, hi) (rounded to the dtype), the same on both sides. I32 tensors get integers. */
void hx_rand(struct hx_tensor *t, float lo, float hi);
/* Integers in [lo, hi] (i32 tensors). */
void hx_rand_int(struct hx_tensor *t, int32_t lo, int32_t hi);
/* Copy host data (bytes in the tensor's dtype, contiguous) to both sides. */
void hx_set(struct hx_tensor *t, const void *data);
/* Read one side back (bytes in the tensor's dtype). out holds t->bytes. */
void hx_get(const struct hx_tensor *t, int side, void *out);
/* Read one side back widened to float (n = elements). */
void hx_get_f32(const struct hx_tensor *t, int side, float *out);

/* Run op (BERTH_OP_*) with params on one side; returns the op's status (the message is in hx_last_error). */
berth_status hx_op(int side, int32_t op, const void *params);
/* supports() on one side (tensor bufs should be NULL for a faithful query). */
berth_status hx_supports(int side, int32_t op, const void *params);
/* Wait for both sides. */
void hx_sync(void);
extern char hx_last_error[512];

/* Assert that both sides' t agree: every element finite on both sides (unless allow_nonfinite), and
 * |gpu - cpu| <= atol + rtol * |cpu| everywhere. `what` names the case in the failure message, which also gives
 * the first bad index and the largest error. Returns the largest |gpu - cpu|. */
double hx_expect_close(const struct hx_tensor *t, double atol, double rtol, const char *what);
/* Exact equality of the stored bytes (i32 outputs). */
void hx_expect_equal(const struct hx_tensor *t, const char *what);

/* Bytes per element (f32/i32: 4, bf16/f16: 2) and the dtype's name, for views and messages. */
int64_t hx_dtype_size(berth_dtype dt);
const char *hx_dtype_name(berth_dtype dt);
/* A view of t on one side: offset and strides in elements (nb[0] = the element size). */
berth_tensor hx_view(const struct hx_tensor *t, int side, int64_t off, int64_t ne0, int64_t ne1, int64_t ne2,
                     int64_t ne3, int64_t nb1, int64_t nb2, int64_t nb3);
/* Run op on both sides (params per side) and wait; both must succeed (a check failure names `what`). */
void hx_run_both(int32_t op, const void *p_cpu, const void *p_gpu, const char *what);
/* t *= k in place on both sides, as the UNARY op (an op that rewrites t between two others). */
void hx_scale_both(const struct hx_tensor *t, float k, const char *what);

/* Deterministic random source seeded from hx->seed (per call sequence). */
uint64_t hx_rand_u64(void);
float hx_rand_uniform(float lo, float hi);

int hx_main(int argc, char **argv, Suite *(*make_suite)(void));

#endif

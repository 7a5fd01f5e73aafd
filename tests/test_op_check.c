/*
 * test_op_check.c — the op parameter checks shared by the backend plugins (plugins/common/op_check*.c, compiled
 * in), against a fake backend: the limits a backend declares in struct opck_backend (which the CPU backend's
 * values never trigger), dtype sets taken from the backend, and exec-mode bounds, alignment and read-only facts
 * that come only through buffer_facts (a device address is never dereferenced). The CPU op tests cover the
 * rest of the messages through the CPU plugin.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "op_check.h"
#include "check_run.h"

/* A fake device buffer: an address the checks may only use for alignment, never read. */
struct berth_buffer {
    uintptr_t addr;
    uint64_t size;
    int read_only;
};

static void fake_facts(const berth_buffer *b, uintptr_t *addr, uint64_t *size, int *read_only)
{
    *addr = b->addr;
    *size = b->size;
    *read_only = b->read_only;
}

#define F32 BERTH_DTYPE_BIT(BERTH_DTYPE_F32)
#define F16 BERTH_DTYPE_BIT(BERTH_DTYPE_F16)

static const struct opck_backend limited = {
    .weight_dtypes = F32 | F16,
    .act_dtypes = F32,
    .kv_dtypes = F16,
    .attn_max_rep = 16,
    .attn_max_head_dim = 256,
    .buffer_facts = fake_facts,
    .conv_max_k = 4,
};

static const struct opck_backend unlimited = {
    .weight_dtypes = F32 | F16,
    .act_dtypes = F32,
    .kv_dtypes = F16,
    .buffer_facts = fake_facts,
};

/* A packed tensor ne {n0, n1, n2} of dtype dt in buf (NULL in queries). */
static berth_tensor tensor(berth_dtype dt, int64_t n0, int64_t n1, int64_t n2, berth_buffer *buf)
{
    const int64_t es = (int64_t)opck_dtype_size(dt);
    berth_tensor t = {.buf = buf, .dtype = dt, .ndim = 3, .ne = {n0, n1, n2, 1}};
    t.nb[0] = es;
    t.nb[1] = es * n0;
    t.nb[2] = t.nb[1] * n1;
    t.nb[3] = t.nb[2] * n2;
    return t;
}

/* A paged F16 view: 4 blocks of 16 tokens, 2 KV heads of head_dim / head_dim_v, K and V laid out alike. */
static berth_kv_view kv_view(int32_t head_dim, int32_t head_dim_v, berth_buffer *k, berth_buffer *v)
{
    const int32_t d = head_dim > head_dim_v ? head_dim : head_dim_v;
    berth_kv_view kv = {
        .k_buf = k, .v_buf = v, .dtype = BERTH_DTYPE_F16, .block_size = 16, .n_blocks = 4, .n_kv_heads = 2,
        .head_dim = head_dim, .head_dim_v = head_dim_v,
    };
    kv.head_stride = kv.v_head_stride = (uint64_t)d * 2;
    kv.token_stride = kv.v_token_stride = 2 * kv.head_stride;
    kv.block_stride = 16 * kv.token_stride;
    return kv;
}

/* Attention query: T = 3 rows of n_heads heads over one sequence. */
static berth_attention_params attention(int32_t head_dim, int32_t head_dim_v, int64_t n_heads)
{
    berth_attention_params p = {
        .struct_size = sizeof p, .mask = BERTH_MASK_CAUSAL, .scale = 1.0f, .n_seqs = 1,
        .q = tensor(BERTH_DTYPE_F32, head_dim, n_heads, 3, NULL),
        .out = tensor(BERTH_DTYPE_F32, head_dim_v, n_heads, 3, NULL),
        .positions = tensor(BERTH_DTYPE_I32, 3, 1, 1, NULL),
        .seq_q_start = tensor(BERTH_DTYPE_I32, 2, 1, 1, NULL),
        .seq_kv_len = tensor(BERTH_DTYPE_I32, 1, 1, 1, NULL),
        .block_table = tensor(BERTH_DTYPE_I32, 4, 1, 1, NULL),
        .kv = kv_view(head_dim, head_dim_v, NULL, NULL),
    };
    return p;
}

static berth_kv_append_params kv_append(int32_t head_dim, int32_t head_dim_v, berth_buffer *k_pool,
                                        berth_buffer *v_pool, berth_buffer *k, berth_buffer *v, berth_buffer *slots)
{
    berth_kv_append_params p = {
        .struct_size = sizeof p,
        .k = tensor(BERTH_DTYPE_F32, head_dim, 2, 3, k),
        .v = tensor(BERTH_DTYPE_F32, head_dim_v, 2, 3, v),
        .slots = tensor(BERTH_DTYPE_I32, 3, 1, 1, slots),
        .kv = kv_view(head_dim, head_dim_v, k_pool, v_pool),
    };
    return p;
}

/* conv1d_causal query: C = 8 channels, T = 3, kernel width K, 2 state slots. */
static berth_conv1d_causal_params conv(int64_t K)
{
    berth_conv1d_causal_params p = {
        .struct_size = sizeof p, .act = BERTH_ACT_SILU, .n_seqs = 1,
        .x = tensor(BERTH_DTYPE_F32, 8, 3, 1, NULL),
        .w = tensor(BERTH_DTYPE_F32, K, 8, 1, NULL),
        .y = tensor(BERTH_DTYPE_F32, 8, 3, 1, NULL),
        .state = tensor(BERTH_DTYPE_F32, K > 0 ? K - 1 : 0, 8, 2, NULL),
        .state_slots = tensor(BERTH_DTYPE_I32, 1, 1, 1, NULL),
        .seq_q_start = tensor(BERTH_DTYPE_I32, 2, 1, 1, NULL),
    };
    return p;
}

#define EXPECT_FAIL(call, c, want_code, want_msg)                                                                  \
    do {                                                                                                           \
        ck_assert(!(call));                                                                                        \
        ck_assert_int_eq((c).code, (want_code));                                                                   \
        ck_assert_str_eq((c).msg, (want_msg));                                                                     \
    } while (0)

START_TEST(test_attention_limits)
{
    struct opck c = {.be = &limited};
    berth_attention_params p = attention(256, 128, 32);
    ck_assert_msg(opck_attention(&c, &p), "%s", c.msg); /* 16 heads per KV head, head_dim at the limit */

    c = (struct opck){.be = &limited};
    p = attention(512, 128, 32);
    EXPECT_FAIL(opck_attention(&c, &p), c, BERTH_E_UNSUPPORTED,
                "attention: head_dim 512 / head_dim_v 128 exceeds this backend's limit of 256");
    c = (struct opck){.be = &limited};
    p = attention(128, 320, 32);
    EXPECT_FAIL(opck_attention(&c, &p), c, BERTH_E_UNSUPPORTED,
                "attention: head_dim 128 / head_dim_v 320 exceeds this backend's limit of 256");
    c = (struct opck){.be = &limited};
    p = attention(128, 128, 34);
    EXPECT_FAIL(opck_attention(&c, &p), c, BERTH_E_UNSUPPORTED, "attention: 17 query heads per KV head (most: 16)");

    /* 0 = no limit */
    c = (struct opck){.be = &unlimited};
    p = attention(1024, 2048, 200);
    ck_assert_msg(opck_attention(&c, &p), "%s", c.msg);

    /* the KV dtype set is the backend's */
    c = (struct opck){.be = &limited};
    p = attention(128, 128, 4);
    p.kv.dtype = BERTH_DTYPE_F32;
    EXPECT_FAIL(opck_attention(&c, &p), c, BERTH_E_UNSUPPORTED,
                "attention: KV dtype f32 is not supported (supported: f16)");
}
END_TEST

START_TEST(test_kv_append_limits)
{
    struct opck c = {.be = &limited};
    berth_kv_append_params p = kv_append(256, 256, NULL, NULL, NULL, NULL, NULL);
    ck_assert_msg(opck_kv_append(&c, &p), "%s", c.msg);
    p = kv_append(128, 300, NULL, NULL, NULL, NULL, NULL);
    EXPECT_FAIL(opck_kv_append(&c, &p), c, BERTH_E_UNSUPPORTED,
                "kv_append: head_dim 128 / head_dim_v 300 exceeds this backend's limit of 256");
    EXPECT_FAIL(opck_kv_append(&c, &p), c, BERTH_E_UNSUPPORTED, /* the first failure stays */
                "kv_append: head_dim 128 / head_dim_v 300 exceeds this backend's limit of 256");
    c = (struct opck){.be = &unlimited};
    ck_assert_msg(opck_kv_append(&c, &p), "%s", c.msg);
}
END_TEST

START_TEST(test_conv_limits)
{
    struct opck c = {.be = &limited};
    berth_conv1d_causal_params p = conv(4);
    ck_assert_msg(opck_conv1d_causal(&c, &p), "%s", c.msg);
    p = conv(5);
    EXPECT_FAIL(opck_conv1d_causal(&c, &p), c, BERTH_E_UNSUPPORTED, "conv1d_causal: kernel width 5 is not in 1..4");
    c = (struct opck){.be = &limited};
    p = conv(0);
    EXPECT_FAIL(opck_conv1d_causal(&c, &p), c, BERTH_E_UNSUPPORTED, "conv1d_causal: kernel width 0 is not in 1..4");

    c = (struct opck){.be = &unlimited};
    p = conv(100);
    ck_assert_msg(opck_conv1d_causal(&c, &p), "%s", c.msg);
    p = conv(0);
    EXPECT_FAIL(opck_conv1d_causal(&c, &p), c, BERTH_E_UNSUPPORTED, "conv1d_causal: kernel width 0 is not >= 1");
}
END_TEST

/* Exec mode: every buffer fact comes from buffer_facts (these addresses are not mapped). */
START_TEST(test_exec_buffer_facts)
{
    berth_buffer bx = {0x10000, 32, 0}, bw = {0x20000, 48, 1}, by = {0x30000, 24, 0};
    berth_matmul_params p = {
        .struct_size = sizeof p,
        .x = tensor(BERTH_DTYPE_F32, 4, 2, 1, &bx),
        .w = tensor(BERTH_DTYPE_F32, 4, 3, 1, &bw), /* read-only weights are fine: matmul never writes them */
        .y = tensor(BERTH_DTYPE_F32, 3, 2, 1, &by),
    };
    struct opck c = {.exec = 1, .be = &limited};
    ck_assert_msg(opck_matmul(&c, &p), "%s", c.msg);

    bx.addr = 0x10002;
    EXPECT_FAIL(opck_matmul(&c, &p), c, BERTH_E_INVALID,
                "matmul: x address or strides are not multiples of its element size 4");
    bx.addr = 0x10000;
    p.x.offset = 2; /* the view's address is the buffer's plus the offset */
    p.x.ne[1] = 1;
    p.y.ne[1] = 1;
    c = (struct opck){.exec = 1, .be = &limited};
    EXPECT_FAIL(opck_matmul(&c, &p), c, BERTH_E_INVALID,
                "matmul: x address or strides are not multiples of its element size 4");
    p.x.offset = 0;
    p.x.ne[1] = 2;
    p.y.ne[1] = 2;

    by.read_only = 1;
    c = (struct opck){.exec = 1, .be = &limited};
    EXPECT_FAIL(opck_matmul(&c, &p), c, BERTH_E_INVALID, "matmul: y is in a read-only buffer");
    by.read_only = 0;

    bw.size = 40;
    c = (struct opck){.exec = 1, .be = &limited};
    EXPECT_FAIL(opck_matmul(&c, &p), c, BERTH_E_INVALID,
                "matmul: w view (offset 0) reaches outside its 40-byte buffer");
}
END_TEST

START_TEST(test_exec_kv_pools)
{
    /* 4 blocks x 16 tokens x 2 heads x 128 f16 = 32768 bytes per pool */
    berth_buffer kp = {0x100000, 32768, 0}, vp = {0x200000, 32768, 0};
    berth_buffer k = {0x300000, 3 * 2 * 128 * 4, 0}, v = {0x400000, 3 * 2 * 128 * 4, 0}, slots = {0x500000, 12, 0};
    berth_kv_append_params p = kv_append(128, 128, &kp, &vp, &k, &v, &slots);
    struct opck c = {.exec = 1, .be = &limited};
    ck_assert_msg(opck_kv_append(&c, &p), "%s", c.msg);

    vp.read_only = 1;
    EXPECT_FAIL(opck_kv_append(&c, &p), c, BERTH_E_INVALID, "kv_append: the KV cache is in a read-only buffer");
    vp.read_only = 0;

    kp.addr = 0x100001;
    c = (struct opck){.exec = 1, .be = &limited};
    EXPECT_FAIL(opck_kv_append(&c, &p), c, BERTH_E_INVALID,
                "kv_append: KV view offsets and strides must be multiples of the element size 2");
    kp.addr = 0x100000;

    vp.size = 32766;
    c = (struct opck){.exec = 1, .be = &limited};
    EXPECT_FAIL(opck_kv_append(&c, &p), c, BERTH_E_INVALID,
                "kv_append: KV view's V pool reaches outside its 32766-byte buffer");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("op_check");
    TCase *tc = tcase_create("op_check");
    tcase_add_test(tc, test_attention_limits);
    tcase_add_test(tc, test_kv_append_limits);
    tcase_add_test(tc, test_conv_limits);
    tcase_add_test(tc, test_exec_buffer_facts);
    tcase_add_test(tc, test_exec_kv_pools);
    suite_add_tcase(s, tc);
    return check_run(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_kv_cache_runner_batches.c — the runner's steps over the paged KV cache, with a mock backend (host memory)
 * and a mock model whose "attention" reads every visible key back through the block table it was given.
 *
 * The mock model stores each token's id (and layer/head/element tags) as K and V at the slot the host chose,
 * and its logits for a row are, per group, how often each id occurs among the keys the row may see (all
 * earlier positions for 'full', the last `window` for 'sliding'), read through the block table. It fails the
 * step if a key it needs sits in a released or foreign block or carries the wrong tags. So equal logits between
 * prefill, chunked prefill, decode and multi-sequence steps mean the runner laid out tokens, positions, slots,
 * block tables, logit rows and sequence ranges consistently. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "kv_cache.h"
#include "runner.h"
#include "check_run.h"

#define VOCAB 32
#define MAX_POS 64
#define WINDOW 5
#define EOS_ID 31

/* ---- mock backend: buffers are malloc'd host memory ---------------------------------------------------------- */
struct mock_buf {
    uint64_t n;
    unsigned char *p;
};
static int live_bufs;

static berth_status mb_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    struct mock_buf *b = calloc(1, sizeof *b);
    b->n = nbytes;
    b->p = malloc(nbytes ? nbytes : 1);
    memset(b->p, 0xA5, nbytes); /* garbage, like a real fresh buffer */
    live_bufs++;
    *out = (berth_buffer *)b;
    return BERTH_OK;
}
static void mb_free(berth_backend *be, berth_buffer *buf)
{
    struct mock_buf *b = (struct mock_buf *)buf;
    if (!b) return;
    live_bufs--;
    free(b->p);
    free(b);
}
static int n_uploads;          /* buffer_upload calls since the test last reset it */
static uint64_t last_upload_off;
static berth_status mb_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t off, const void *src,
                              uint64_t n)
{
    struct mock_buf *b = (struct mock_buf *)dst;
    n_uploads++;
    last_upload_off = off;
    if (off + n > b->n) return BERTH_E_INVALID;
    memcpy(b->p + off, src, n);
    return BERTH_OK;
}
static berth_status mb_download(berth_backend *be, berth_stream *s, const berth_buffer *src, uint64_t off, void *dst,
                                uint64_t n)
{
    const struct mock_buf *b = (const struct mock_buf *)src;
    if (off + n > b->n) return BERTH_E_INVALID;
    memcpy(dst, b->p + off, n);
    return BERTH_OK;
}
static berth_status mb_fill(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t off, uint8_t byte,
                            uint64_t n)
{
    struct mock_buf *b = (struct mock_buf *)dst;
    if (off + n > b->n) return BERTH_E_INVALID;
    memset(b->p + off, byte, n);
    return BERTH_OK;
}
static int stream_token;
static berth_status mb_stream_create(berth_backend *be, berth_stream **out)
{
    *out = (berth_stream *)&stream_token;
    return BERTH_OK;
}
static void mb_stream_destroy(berth_backend *be, berth_stream *s) {}
static berth_status mb_stream_sync(berth_backend *be, berth_stream *s) { return BERTH_OK; }

static berth_backend_vtable mock_bvt;
static berth_device_info mock_dev;
static berth_backend_api mock_api;

static void *tptr(const berth_tensor *t) { return ((struct mock_buf *)t->buf)->p + t->offset; }

/* ---- mock model ---------------------------------------------------------------------------------------------- */
static berth_kv_group_desc gd_sliding, gd_full;
static const berth_kv_group_desc *gds[2] = {&gd_sliding, &gd_full};
struct mock_model {
    int loaded;
    berth_load_params lp;
    int64_t n_forward, n_rows_in, n_logit_rows;
    int64_t max_tokens_seen;
};
static struct mock_model the_model;
static char mock_error[256];

static berth_status mm_info(const berth_model *m, berth_model_info *out)
{
    memset((char *)out + sizeof out->struct_size, 0, out->struct_size - sizeof out->struct_size);
    out->vocab_size = VOCAB;
    out->n_layers = 3;
    out->hidden_size = 8;
    out->max_positions = MAX_POS;
    out->bos_id = 2;
    out->n_eos = 1;
    out->eos_ids[0] = EOS_ID;
    out->decoder_start_id = -1;
    strcpy(out->arch, "mock");
    return BERTH_OK;
}
static berth_status mm_layout(const berth_model *m, berth_memory_layout *out)
{
    memset(&gd_sliding, 0, sizeof gd_sliding);
    gd_sliding.struct_size = sizeof gd_sliding;
    gd_sliding.kind = BERTH_KV_SLIDING;
    gd_sliding.window = WINDOW;
    gd_sliding.n_layers = 2;
    gd_sliding.n_kv_heads = 2;
    gd_sliding.head_dim = 3;
    gd_sliding.head_dim_v = 3;
    strcpy(gd_sliding.name, "sliding");
    memset(&gd_full, 0, sizeof gd_full);
    gd_full.struct_size = sizeof gd_full;
    gd_full.kind = BERTH_KV_FULL;
    gd_full.n_layers = 1;
    gd_full.n_kv_heads = 1;
    gd_full.head_dim = 4;
    gd_full.head_dim_v = 2;
    strcpy(gd_full.name, "full");
    out->n_kv_groups = 2;
    out->kv_groups = gds;
    out->n_states = 0;
    out->states = NULL;
    return BERTH_OK;
}
static berth_status mm_load(berth_model *m, const berth_backend_api *be, const berth_load_params *lp)
{
    the_model.loaded = 1;
    the_model.lp = *lp;
    return BERTH_OK;
}

static float *k_at(const berth_kv_group_batch *g, int32_t layer, int32_t block, int32_t off, int32_t head, int v)
{
    const berth_kv_view *kv = &g->pool;
    uint64_t o = (uint64_t)layer * g->layer_stride + (uint64_t)block * kv->block_stride;
    if (v)
        o += kv->v_offset + (uint64_t)off * kv->v_token_stride + (uint64_t)head * kv->v_head_stride;
    else
        o += kv->k_offset + (uint64_t)off * kv->token_stride + (uint64_t)head * kv->head_stride;
    return (float *)(((struct mock_buf *)(v ? kv->v_buf : kv->k_buf))->p + o);
}

static berth_status mock_fail(const char *msg, int a, int b)
{
    snprintf(mock_error, sizeof mock_error, msg, a, b);
    berth_fail(BERTH_E_INTERNAL, "%s", mock_error);
    return BERTH_E_INTERNAL;
}

static berth_status mm_forward(berth_model *m, berth_stream *s, const berth_batch *b)
{
    the_model.n_forward++;
    the_model.n_rows_in += b->n_tokens;
    the_model.n_logit_rows += b->n_logits;
    if (b->n_tokens > the_model.max_tokens_seen) the_model.max_tokens_seen = b->n_tokens;
    const int32_t *tokens = tptr(&b->tokens), *pos = tptr(&b->positions), *qs = tptr(&b->seq_q_start),
                  *kvl = tptr(&b->seq_kv_len);
    /* Device copies equal the host copies. */
    for (int32_t t = 0; t < b->n_tokens; t++)
        if (tokens[t] != b->h_tokens[t] || pos[t] != b->h_positions[t]) return mock_fail("token %d differs", t, 0);
    if (b->tokens.ne[0] != b->n_tokens || b->seq_q_start.ne[0] != b->n_seqs + 1 || b->logits.ne[0] != VOCAB ||
        b->logits.ne[1] != b->n_logits || b->logit_rows.ne[0] != b->n_logits)
        return mock_fail("bad tensor shapes", 0, 0);
    if (qs[0] != 0 || qs[b->n_seqs] != b->n_tokens) return mock_fail("bad seq_q_start", 0, 0);
    /* Store K/V of every new token: K[e] = id + 100 layer + 10 head + e / 10, V = -K. */
    for (int32_t g = 0; g < b->n_kv_groups; g++) {
        const berth_kv_group_batch *gb = &b->kv[g];
        const int32_t *slots = tptr(&gb->slots);
        int32_t bs = gb->pool.block_size;
        for (int32_t t = 0; t < b->n_tokens; t++) {
            int32_t blk = slots[t] / bs, off = slots[t] % bs;
            if (slots[t] < 0 || blk >= gb->pool.n_blocks) return mock_fail("bad slot %d for token %d", slots[t], t);
            for (int32_t l = 0; l < gds[g]->n_layers; l++)
                for (int32_t h = 0; h < gb->pool.n_kv_heads; h++) {
                    float *k = k_at(gb, l, blk, off, h, 0), *v = k_at(gb, l, blk, off, h, 1);
                    for (int32_t e = 0; e < gb->pool.head_dim; e++) k[e] = tokens[t] + 100.0f * l + 10.0f * h + e / 10.0f;
                    for (int32_t e = 0; e < gb->pool.head_dim_v; e++) v[e] = -(tokens[t] + 100.0f * l + 10.0f * h + e / 10.0f);
                }
        }
    }
    /* Logits of the wanted rows. */
    const int32_t *rows = tptr(&b->logit_rows);
    float *logits = tptr(&b->logits);
    for (int32_t r = 0; r < b->n_logits; r++) {
        int32_t t = rows[r];
        if (t != b->h_logit_rows[r] || t < 0 || t >= b->n_tokens || (r && rows[r - 1] >= t))
            return mock_fail("bad logit row %d", r, 0);
        int32_t i = 0;
        while (!(qs[i] <= t && t < qs[i + 1])) i++;
        int32_t p = pos[t];
        if (p >= kvl[i]) return mock_fail("position %d beyond kv length %d", p, kvl[i]);
        float *out = logits + (size_t)r * VOCAB;
        for (int32_t v = 0; v < VOCAB; v++) out[v] = 0.0f;
        for (int32_t g = 0; g < b->n_kv_groups; g++) {
            const berth_kv_group_batch *gb = &b->kv[g];
            const int32_t *table = tptr(&gb->block_table);
            int32_t width = (int32_t)gb->block_table.ne[0], bs = gb->pool.block_size;
            int32_t lo = gds[g]->kind == BERTH_KV_SLIDING ? p - gds[g]->window + 1 : 0;
            if (lo < 0) lo = 0;
            for (int32_t key = lo; key <= p; key++) {
                if (key / bs >= width) return mock_fail("block table too narrow for key %d", key, 0);
                int32_t blk = table[(size_t)i * width + key / bs];
                if (blk < 0 || blk >= gb->pool.n_blocks) return mock_fail("key %d has block %d", key, blk);
                for (int32_t l = 0; l < gds[g]->n_layers; l++)
                    for (int32_t h = 0; h < gb->pool.n_kv_heads; h++) {
                        float *k = k_at(gb, l, blk, key % bs, h, 0), *v = k_at(gb, l, blk, key % bs, h, 1);
                        float id = k[0] - 100.0f * l - 10.0f * h;
                        if (id < 0 || id >= VOCAB || id != floorf(id)) return mock_fail("key %d has garbage", key, 0);
                        for (int32_t e = 1; e < gb->pool.head_dim; e++)
                            if (fabsf(k[e] - (k[0] + e / 10.0f)) > 1e-4f) return mock_fail("key %d element %d", key, e);
                        if (v[0] != -k[0]) return mock_fail("value %d mismatch", key, 0);
                        if (l == 0 && h == 0) out[(int32_t)id] += (float)(g + 1) + 0.01f * (float)key;
                    }
            }
        }
    }
    return BERTH_OK;
}

static berth_status mm_counters(const berth_model *m, berth_counter *out, int32_t cap, int32_t *n)
{
    berth_counter c[2] = {{"forward_calls", the_model.n_forward}, {"tokens_in", the_model.n_rows_in}};
    for (int32_t i = 0; i < 2 && i < cap; i++) out[i] = c[i];
    *n = 2;
    return BERTH_OK;
}

static berth_model_vtable mock_mvt;

static struct runner *make_runner(int32_t max_batch_tokens, int32_t max_seqs, uint64_t kv_memory)
{
    memset(&mock_bvt, 0, sizeof mock_bvt);
    mock_bvt.struct_size = sizeof mock_bvt;
    mock_bvt.buffer_alloc = mb_alloc;
    mock_bvt.buffer_free = mb_free;
    mock_bvt.buffer_upload = mb_upload;
    mock_bvt.buffer_download = mb_download;
    mock_bvt.buffer_fill = mb_fill;
    mock_bvt.stream_create = mb_stream_create;
    mock_bvt.stream_destroy = mb_stream_destroy;
    mock_bvt.stream_sync = mb_stream_sync;
    memset(&mock_dev, 0, sizeof mock_dev);
    mock_dev.struct_size = sizeof mock_dev;
    strcpy(mock_dev.name, "mock");
    memset(&mock_api, 0, sizeof mock_api);
    mock_api.struct_size = sizeof mock_api;
    mock_api.vt = &mock_bvt;
    mock_api.ops = NULL; /* no sample op: greedy falls back to a host argmax */
    mock_api.device = &mock_dev;
    memset(&mock_mvt, 0, sizeof mock_mvt);
    mock_mvt.struct_size = sizeof mock_mvt;
    mock_mvt.info = mm_info;
    mock_mvt.memory_layout = mm_layout;
    mock_mvt.load = mm_load;
    mock_mvt.forward = mm_forward;
    mock_mvt.counters = mm_counters;
    memset(&the_model, 0, sizeof the_model);

    struct runner_config c;
    memset(&c, 0, sizeof c);
    c.be = &mock_api;
    c.mvt = &mock_mvt;
    c.model = (berth_model *)&the_model;
    c.model_dir = "/models/mock";
    c.max_batch_tokens = max_batch_tokens;
    c.max_seqs = max_seqs;
    c.kv_block_size = 4;
    c.kv_memory = kv_memory;
    struct runner *r = NULL;
    berth_status st = runner_create(&c, &r);
    ck_assert_msg(st == BERTH_OK, "runner_create: %s", berth_last_error());
    ck_assert_int_eq(the_model.loaded, 1);
    ck_assert_int_eq(the_model.lp.max_batch_tokens, max_batch_tokens);
    ck_assert_int_eq(the_model.lp.max_seqs, max_seqs);
    ck_assert_int_eq(the_model.lp.act_dtype, BERTH_DTYPE_F32);
    ck_assert_int_eq(the_model.lp.kv_dtype, BERTH_DTYPE_F32);
    /* load() gets the runner's stream, the one every step runs on (ABI 0.2) */
    ck_assert_uint_eq(the_model.lp.struct_size, sizeof(berth_load_params));
    ck_assert_ptr_eq(the_model.lp.stream, (berth_stream *)&stream_token);
    return r;
}

static void make_ids(int32_t *ids, int32_t n, uint32_t salt)
{
    for (int32_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 7u + salt * 13u + (uint32_t)(i * i)) % (VOCAB - 1));
}

static void assert_rows_equal(const float *a, const float *b, int32_t rows, const char *what)
{
    for (int32_t i = 0; i < rows * VOCAB; i++)
        ck_assert_msg(a[i] == b[i], "%s: row %d id %d: %g vs %g", what, i / VOCAB, i % VOCAB, a[i], b[i]);
}

START_TEST(test_decode_matches_prefill)
{
    enum { N = 10, K = 9 };
    int32_t ids[N + K];
    make_ids(ids, N + K, 1);
    float full[(N + K) * VOCAB], part[(N + K) * VOCAB];

    struct runner *r = make_runner(64, 1, 1u << 20);
    int32_t seq;
    ck_assert_int_eq(runner_seq_new(r, &seq), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, seq, ids, N + K, 1, full), BERTH_OK);
    runner_seq_free(r, seq);
    /* Logits depend on the keys: row p counts p + 1 full keys, min(p + 1, 5) sliding keys. */
    float sum = 0;
    for (int32_t v = 0; v < VOCAB; v++) sum += full[(N + K - 1) * VOCAB + v];
    ck_assert_float_gt(sum, 0.0f);

    const struct runner_stats *st0 = runner_stats(r);
    int64_t fwd0 = st0->forward_calls, pre0 = st0->prefill_tokens;
    ck_assert_int_eq(runner_seq_new(r, &seq), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, seq, ids, N, 1, part), BERTH_OK);
    for (int32_t k = 0; k < K; k++)
        ck_assert_msg(runner_decode(r, seq, ids[N + k], part + (size_t)(N + k) * VOCAB) == BERTH_OK, "%s",
                      berth_last_error());
    assert_rows_equal(full, part, N + K, "prefill+decode vs prefill");
    const struct runner_stats *st = runner_stats(r);
    ck_assert_int_eq(st->decode_steps, K);
    ck_assert_int_eq(st->prefill_tokens - pre0, N);
    ck_assert_int_eq(st->forward_calls - fwd0, 1 + K);
    ck_assert_int_eq(runner_seq_len(r, seq), N + K);
    /* The last step's query (18) saw keys 14..18, so the sliding group keeps table entries 3 and 4 (positions
     * 12..19) and released 0..2; full holds all 5. */
    ck_assert_int_eq(kv_blocks_in_use(runner_kv(r), 0), 2);
    ck_assert_int_eq(kv_blocks_in_use(runner_kv(r), 1), 5);
    ck_assert_int_eq(kv_cache_validate(runner_kv(r)), BERTH_OK);
    runner_seq_free(r, seq);
    ck_assert_int_eq(kv_blocks_in_use(runner_kv(r), 0), 0);
    runner_free(r);
    ck_assert_int_eq(live_bufs, 0);
}
END_TEST

START_TEST(test_chunked_prefill)
{
    enum { N = 23 };
    int32_t ids[N];
    make_ids(ids, N, 2);
    float whole[N * VOCAB], chunked[N * VOCAB], last[VOCAB];
    struct runner *r = make_runner(64, 1, 1u << 20);
    int32_t seq;
    ck_assert_int_eq(runner_seq_new(r, &seq), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, seq, ids, N, 1, whole), BERTH_OK);
    ck_assert_int_eq(the_model.n_forward, 1);
    runner_free(r);

    r = make_runner(4, 1, 1u << 20);
    ck_assert_int_eq(runner_seq_new(r, &seq), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, seq, ids, N, 1, chunked), BERTH_OK);
    assert_rows_equal(whole, chunked, N, "chunked vs whole");
    ck_assert_int_eq(the_model.n_forward, 6); /* ceil(23 / 4) */
    ck_assert_int_eq(the_model.max_tokens_seen, 4);
    ck_assert_int_eq(runner_stats(r)->prefill_tokens, N);
    ck_assert_int_eq(runner_stats(r)->forward_calls, 6);
    runner_seq_free(r, seq);

    /* Without all logits: only the last chunk asks for one row. */
    int64_t rows0 = the_model.n_logit_rows;
    ck_assert_int_eq(runner_seq_new(r, &seq), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, seq, ids, N, 0, last), BERTH_OK);
    ck_assert_int_eq(the_model.n_logit_rows - rows0, 1);
    assert_rows_equal(whole + (N - 1) * VOCAB, last, 1, "last row");
    berth_counter c[4];
    int32_t n = 0;
    ck_assert_int_eq(runner_model_counters(r, c, 4, &n), BERTH_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(c[0].name, "forward_calls");
    ck_assert_int_eq(c[0].value, 12);
    runner_free(r);
}
END_TEST

START_TEST(test_two_sequences_in_one_step)
{
    enum { NA = 7, NB = 12 };
    int32_t a[NA + 1], b[NB + 1];
    make_ids(a, NA + 1, 3);
    make_ids(b, NB + 1, 4);
    float ra[(NA + 1) * VOCAB], rb[(NB + 1) * VOCAB], got[(NA + NB) * VOCAB], step2[2 * VOCAB];
    struct runner *r = make_runner(64, 2, 1u << 20);
    int32_t sa, sb;
    ck_assert_int_eq(runner_seq_new(r, &sa), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, sa, a, NA + 1, 1, ra), BERTH_OK);
    runner_seq_free(r, sa);
    ck_assert_int_eq(runner_seq_new(r, &sb), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, sb, b, NB + 1, 1, rb), BERTH_OK);
    runner_seq_free(r, sb);

    ck_assert_int_eq(runner_seq_new(r, &sa), BERTH_OK);
    ck_assert_int_eq(runner_seq_new(r, &sb), BERTH_OK);
    struct runner_seq_step steps[2] = {{sa, a, NA, RUNNER_LOGITS_ALL, 0, 0}, {sb, b, NB, RUNNER_LOGITS_ALL, 0, 0}};
    n_uploads = 0;
    ck_assert_int_eq(runner_step(r, steps, 2), BERTH_OK);
    /* a step's metadata (tokens, positions, ranges, logit rows, each group's table and slots) is one transfer */
    ck_assert_int_eq(n_uploads, 1);
    ck_assert_uint_eq(last_upload_off, 0);
    ck_assert_int_eq(runner_n_logits(r), NA + NB);
    ck_assert_int_eq(runner_logits(r, 0, NA + NB, got), BERTH_OK);
    assert_rows_equal(ra, got, NA, "seq a in a pair");
    assert_rows_equal(rb, got + NA * VOCAB, NB, "seq b in a pair");
    /* Then one decode row each, in reverse order. */
    struct runner_seq_step dec[2] = {{sb, b + NB, 1, RUNNER_LOGITS_LAST, 1, 0}, {sa, a + NA, 1, RUNNER_LOGITS_LAST, 1, 0}};
    n_uploads = 0;
    ck_assert_int_eq(runner_step(r, dec, 2), BERTH_OK);
    ck_assert_int_eq(n_uploads, 1);
    ck_assert_int_eq(runner_logits(r, 0, 2, step2), BERTH_OK);
    assert_rows_equal(rb + NB * VOCAB, step2, 1, "decode b");
    assert_rows_equal(ra + NA * VOCAB, step2 + VOCAB, 1, "decode a");
    ck_assert_int_eq(runner_stats(r)->decode_steps, 2);

    struct runner_seq_step twice[2] = {{sa, a, 1, RUNNER_LOGITS_LAST, 1, 0}, {sa, a, 1, RUNNER_LOGITS_LAST, 1, 0}};
    ck_assert_int_eq(runner_step(r, twice, 2), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "sequence 0 appears twice in one step");
    ck_assert_int_eq(runner_logits(r, 0, 1, step2), BERTH_E_INVALID);
    runner_free(r);
}
END_TEST

static int32_t seen[64];
static int32_t n_seen;
static int on_token(int32_t tok, void *arg)
{
    seen[n_seen++] = tok;
    return 0;
}

START_TEST(test_generate_and_errors)
{
    struct runner *r = make_runner(8, 1, 1u << 20);
    int32_t prompt[5] = {3, 9, 9, 4, 9};
    struct runner_gen_params greedy = {.max_new = 6, .sampling = {.temperature = 0.0f, .top_p = 1.0f}};
    struct runner_generation g;
    float plog[5 * VOCAB];
    n_seen = 0;
    ck_assert_int_eq(runner_generate(r, prompt, 5, &greedy, plog, on_token, NULL, &g), BERTH_OK);
    /* Greedy on "most frequent visible id": 9 dominates, so every step repeats 9. */
    ck_assert_int_eq(g.n_tokens, 6);
    ck_assert_str_eq(g.finish_reason, "length");
    for (int32_t i = 0; i < 6; i++) ck_assert_int_eq(g.tokens[i], 9);
    ck_assert_int_eq(n_seen, 6);
    ck_assert_int_eq(runner_stats(r)->decode_steps, 5);
    ck_assert_int_eq(runner_stats(r)->prefill_tokens, 5);
    ck_assert_int_eq(kv_blocks_in_use(runner_kv(r), 1), 0); /* the sequence was freed */
    ck_assert_int_eq(runner_stats(r)->kv_peak_blocks[1], 3); /* 10 tokens of the full group, 4 per block */
    ck_assert_float_gt(plog[4 * VOCAB + 9], plog[4 * VOCAB + 3]);
    free(g.tokens);

    /* EOS stops with "stop". */
    int32_t eos_prompt[3] = {EOS_ID, EOS_ID, 1};
    greedy.max_new = 10;
    ck_assert_int_eq(runner_generate(r, eos_prompt, 3, &greedy, NULL, NULL, NULL, &g), BERTH_OK);
    ck_assert_int_eq(g.n_tokens, 1);
    ck_assert_int_eq(g.tokens[0], EOS_ID);
    ck_assert_str_eq(g.finish_reason, "stop");
    free(g.tokens);
    /* ... unless told to ignore it. */
    greedy.ignore_eos = 1;
    ck_assert_int_eq(runner_generate(r, eos_prompt, 3, &greedy, NULL, NULL, NULL, &g), BERTH_OK);
    ck_assert_int_eq(g.n_tokens, 10);
    ck_assert_str_eq(g.finish_reason, "length");
    for (int32_t i = 0; i < 10; i++) ck_assert_int_eq(g.tokens[i], EOS_ID);
    free(g.tokens);
    greedy.ignore_eos = 0;
    greedy.max_new = 2;

    int32_t bad[5] = {1, 2, 3, 4, 300};
    ck_assert_int_eq(runner_generate(r, bad, 5, &greedy, NULL, NULL, NULL, &g), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "token id 300 at prompt position 4 is outside the vocabulary (size 32)");
    bad[4] = -1;
    ck_assert_int_eq(runner_generate(r, bad, 5, &greedy, NULL, NULL, NULL, &g), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "token id -1 at prompt position 4 is outside the vocabulary (size 32)");
    greedy.max_new = 60;
    ck_assert_int_eq(runner_generate(r, prompt, 5, &greedy, NULL, NULL, NULL, &g), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "prompt of 5 tokens + 60 new tokens exceeds the context limit of 64 "
                                         "(max_position_embeddings in /models/mock/config.json)");
    greedy.max_new = 2;
    ck_assert_int_eq(runner_generate(r, prompt, 0, &greedy, NULL, NULL, NULL, &g), BERTH_E_INVALID);
    ck_assert_str_eq(berth_last_error(), "the prompt is empty (give at least one token id)");
    /* Exactly at the limit is fine. */
    greedy.max_new = 59;
    ck_assert_int_eq(runner_generate(r, prompt, 5, &greedy, NULL, NULL, NULL, &g), BERTH_OK);
    ck_assert_int_eq(g.n_tokens, 59);
    free(g.tokens);
    /* Sampling needs the backend's sample op; this mock has none. */
    struct runner_gen_params hot = {.max_new = 2, .sampling = {.temperature = 0.8f, .top_p = 1.0f, .seed = 1}};
    ck_assert_int_eq(runner_generate(r, prompt, 5, &hot, NULL, NULL, NULL, &g), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(berth_last_error(), "backend 'mock' has no sample op: only --temperature 0 works");
    ck_assert_int_eq(kv_blocks_in_use(runner_kv(r), 1), 0);
    runner_free(r);
}
END_TEST

START_TEST(test_kv_exhaustion_through_runner)
{
    /* Block bytes: sliding 2 layers * 2 planes * 4 tokens * 2 heads * 3 * 4 B = 384; full 1 layer * 4 tokens * 1
     * head * (K 4 + V 2) * 4 B = 96 (V takes only its own width). 4 * 480 B = 4 blocks each (sliding cap
     * 1 * (ceil((5 + 8 - 1) / 4) + 1) = 4, just reached). */
    struct runner *r = make_runner(8, 1, 4 * 480);
    ck_assert_int_eq(kv_blocks_total(runner_kv(r), 0), 4);
    ck_assert_int_eq(kv_blocks_total(runner_kv(r), 1), 4);
    int32_t ids[20];
    make_ids(ids, 20, 5);
    int32_t seq;
    ck_assert_int_eq(runner_seq_new(r, &seq), BERTH_OK);
    ck_assert_int_eq(runner_prefill(r, seq, ids, 16, 0, NULL), BERTH_OK);
    ck_assert_int_eq(runner_decode(r, seq, ids[16], NULL), BERTH_E_DEVICE_OOM);
    ck_assert_str_eq(berth_last_error(),
                     "KV cache exhausted: group 'full' needs 1 more blocks, 0 free (raise [kv] memory)");
    ck_assert_int_eq(kv_cache_validate(runner_kv(r)), BERTH_OK);
    runner_free(r);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("runner_batches");
    TCase *tc = tcase_create("mock");
    tcase_add_test(tc, test_decode_matches_prefill);
    tcase_add_test(tc, test_chunked_prefill);
    tcase_add_test(tc, test_two_sequences_in_one_step);
    tcase_add_test(tc, test_generate_and_errors);
    tcase_add_test(tc, test_kv_exhaustion_through_runner);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/*
 * test_engine_recurrent_state.c — per-sequence recurrent-state slots end to end (host/kv_cache.c state pools and
 * snapshots, host/runner.c, host/scheduler.c) on the CPU backend, with the state test model
 * (tests/state_model/test_state_model.c): its logits row is the count of each token id the sequence has seen, so
 * every assertion below compares logits with counts of the exact history the host should have fed.
 *
 *  - a new sequence's state is zero, also when it reuses the slot of a freed one;
 *  - the state carries across decode steps and across chunked prefill (chunk < prompt);
 *  - sequences in one step (prefill chunks and decode rows mixed) do not mix;
 *  - fork copies the state, and parent and child then diverge, each counting its own history;
 *  - a prefix hit restores the snapshot taken where a step ended on a block boundary (logits equal counts of the
 *    whole prompt, the model computes only the uncached tokens, the counters show the cached tokens); where no
 *    step ended on the boundary there is no snapshot and no hit; evicted snapshots give no hit either;
 *  - through the scheduler (chunked prefill, concurrent requests, n = 4 by fork, a follow-up prompt hitting the
 *    cache, preemption by recompute): the logprobs of every sampled token equal the log-softmax of the counts of
 *    that sample's own history.
 *
 * argv[1]: the build's plugins/ folder (CPU backend); argv[2]: the state model's build folder. Each test writes its
 * checkpoint (config.json, a one-tensor model.safetensors) and its config into a fresh temporary directory.
 */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "config.h"
#include "errors.h"
#include "registry.h"
#include "runner.h"
#include "scheduler.h"
#include "check_run.h"

#define V 16
#define BS 4
#define TOL 1e-4

static const char *plugin_dir, *state_dir;

/* ---- files ---- */

static void write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", p);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void rm_dir(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

/* A checkpoint the state model accepts and a config with the CPU backend and the state model's folder. */
static char *write_checkpoint(void)
{
    const char *base = getenv("TMPDIR");
    char buf[512];
    snprintf(buf, sizeof buf, "%s/berth-state-XXXXXX", base && *base ? base : "/tmp");
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp failed");
    char *dir = strdup(buf);
    char cfg[128];
    snprintf(cfg, sizeof cfg, "{\"model_type\": \"berth_state_test\", \"vocab_size\": %d, "
             "\"max_position_embeddings\": 128}\n", V);
    write_file(dir, "config.json", cfg, strlen(cfg));
    /* One f32 tensor; the header is padded with spaces to 8 bytes as the format allows. */
    char header[96];
    int hl = snprintf(header, sizeof header, "{\"dummy\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}");
    while (hl % 8) header[hl++] = ' ';
    unsigned char st[8 + 96 + 4];
    for (int i = 0; i < 8; i++) st[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(st + 8, header, (size_t)hl);
    memset(st + 8 + hl, 0, 4);
    write_file(dir, "model.safetensors", st, (size_t)(8 + hl + 4));
    char ini[2048];
    snprintf(ini, sizeof ini,
             "[plugins]\ndir = %s\ndir = %s\n\n[backend.cpu]\nenabled = true\npriority = 10\nthreads = 1\n\n"
             "[backend.cuda]\nenabled = false\n\n[kv]\nblock_size = %d\nmemory = 1MiB\n\n"
             "[scheduler]\nmax_batch_tokens = 8\nmax_seqs = 4\n",
             plugin_dir, state_dir, BS);
    write_file(dir, "berth.ini", ini, strlen(ini));
    return dir;
}

/* ---- session: config -> registry -> checkpoint -> selection -> runner ---- */

struct session {
    char *dir;
    struct berth_config *cfg;
    struct registry *reg;
    berth_checkpoint *ck;
    struct selection sel;
    int have_sel;
    struct runner *r;
};

static void open_session(struct session *s, int32_t max_tokens, int32_t max_seqs, uint64_t kv_memory,
                         int32_t snapshots)
{
    memset(s, 0, sizeof *s);
    s->dir = write_checkpoint();
    char path[1024];
    snprintf(path, sizeof path, "%s/berth.ini", s->dir);
    ck_assert_msg(config_load(path, &s->cfg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(registry_load(s->cfg, &s->reg) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(ckpt_open(s->dir, &s->ck) == BERTH_OK, "%s", berth_last_error());
    ck_assert_msg(registry_select(s->reg, s->ck, &s->sel) == BERTH_OK, "%s\n%s", berth_last_error(), s->sel.why);
    s->have_sel = 1;
    ck_assert_str_eq(s->sel.backend_plugin->desc->name, "cpu");
    ck_assert_str_eq(s->sel.model_plugin->desc->name, "state_test");
    struct runner_config rc;
    memset(&rc, 0, sizeof rc);
    rc.be = &s->sel.api;
    rc.mvt = s->sel.model_plugin->desc->vtable;
    rc.model = s->sel.model;
    rc.ck = s->ck;
    rc.model_dir = s->dir;
    rc.max_batch_tokens = max_tokens;
    rc.max_seqs = max_seqs;
    rc.kv_block_size = BS;
    rc.kv_memory = kv_memory;
    rc.state_snapshots = snapshots;
    ck_assert_msg(runner_create(&rc, &s->r) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(runner_info(s->r)->vocab_size, V);
    ck_assert_int_eq(kv_n_states(runner_kv(s->r)), 1);
}

static void close_session(struct session *s)
{
    runner_free(s->r);
    if (s->have_sel) selection_destroy_model(&s->sel);
    ckpt_close(s->ck);
    if (s->have_sel) selection_release(&s->sel);
    registry_free(s->reg);
    config_free(s->cfg);
    rm_dir(s->dir);
    memset(s, 0, sizeof *s);
}

static int64_t model_counter(const struct runner *r, const char *name)
{
    berth_counter c[8];
    int32_t n = 0;
    ck_assert_int_eq(runner_model_counters(r, c, 8, &n), BERTH_OK);
    for (int32_t i = 0; i < n && i < 8; i++)
        if (strcmp(c[i].name, name) == 0) return c[i].value;
    ck_abort_msg("the state model has no counter '%s'", name);
    return -1;
}

/* ---- expectations ---- */

static void counts_of(const int32_t *hist, int32_t n, float *out)
{
    for (int32_t v = 0; v < V; v++) out[v] = 0.0f;
    for (int32_t i = 0; i < n; i++) out[hist[i]] += 1.0f;
}

/* row must be exactly the counts of hist[0..n). */
static void expect_counts(const float *row, const int32_t *hist, int32_t n, const char *what, int32_t at)
{
    float want[V];
    counts_of(hist, n, want);
    for (int32_t v = 0; v < V; v++)
        ck_assert_msg(row[v] == want[v], "%s, row %d: logit %d is %g, the history of %d tokens has %g", what,
                      (int)at, (int)v, (double)row[v], (int)n, (double)want[v]);
}

/* Deterministic "random" tokens. */
static void fill_ids(int32_t *ids, int32_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (int32_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        ids[i] = (int32_t)(x % V);
    }
}

static void prefill_all(struct runner *r, int32_t seq, const int32_t *ids, int32_t n, float *out)
{
    ck_assert_msg(runner_prefill(r, seq, ids, n, 1, out) == BERTH_OK, "%s", berth_last_error());
}

/* ---- runner tests ---- */

START_TEST(test_zero_carry_chunked)
{
    struct session s;
    open_session(&s, 4, 2, 1 << 20, 0);
    struct runner *r = s.r;
    float row[V];
    /* (a) a fresh sequence starts at zero: its first token's logits are that token's one-hot. */
    int32_t a, b;
    ck_assert_int_eq(runner_seq_new(r, &a), BERTH_OK);
    ck_assert_msg(runner_decode(r, a, 3, row) == BERTH_OK, "%s", berth_last_error());
    int32_t t3 = 3;
    expect_counts(row, &t3, 1, "fresh sequence", 0);

    /* (b) chunked prefill: 11 tokens through chunks of 4; every row counts the prompt up to it. */
    int32_t p[16];
    fill_ids(p, 11, 1);
    ck_assert_int_eq(runner_seq_new(r, &b), BERTH_OK);
    int64_t calls0 = runner_stats(r)->forward_calls;
    float all[11 * V];
    prefill_all(r, b, p, 11, all);
    ck_assert_int_eq(runner_stats(r)->forward_calls - calls0, 3);
    for (int32_t i = 0; i < 11; i++) expect_counts(all + i * V, p, i + 1, "chunked prefill", i);
    /* ... and across decode steps. */
    fill_ids(p + 11, 5, 2);
    for (int32_t i = 11; i < 16; i++) {
        ck_assert_msg(runner_decode(r, b, p[i], row) == BERTH_OK, "%s", berth_last_error());
        expect_counts(row, p, i + 1, "decode", i);
    }
    /* a was untouched by b's steps. */
    ck_assert_msg(runner_decode(r, a, 7, row) == BERTH_OK, "%s", berth_last_error());
    int32_t ha[2] = {3, 7};
    expect_counts(row, ha, 2, "the other sequence", 1);

    /* A freed slot is zeroed when reused (the lowest free id is taken again). */
    runner_seq_free(r, b);
    int32_t c;
    ck_assert_int_eq(runner_seq_new(r, &c), BERTH_OK);
    ck_assert_int_eq(c, b);
    ck_assert_msg(runner_decode(r, c, 5, row) == BERTH_OK, "%s", berth_last_error());
    int32_t t5 = 5;
    expect_counts(row, &t5, 1, "reused slot", 0);
    ck_assert_int_eq(model_counter(r, "tokens"), 1 + 11 + 5 + 1 + 1);
    runner_seq_free(r, a);
    runner_seq_free(r, c);
    ck_assert_msg(kv_cache_validate(runner_kv(r)) == BERTH_OK, "%s", berth_last_error());
    close_session(&s);
}
END_TEST

START_TEST(test_concurrent_mixed)
{
    struct session s;
    open_session(&s, 16, 3, 1 << 20, 0);
    struct runner *r = s.r;
    int32_t seq[3], h[3][16], n[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(runner_seq_new(r, &seq[k]), BERTH_OK);
        fill_ids(h[k], 16, 10 + (uint32_t)k);
    }
    /* Step 1: three prefill chunks (all rows of 0 and 1, the last row of 2). */
    struct runner_seq_step st1[3] = {{seq[0], h[0], 5, RUNNER_LOGITS_ALL, 0, 0},
                                     {seq[1], h[1], 3, RUNNER_LOGITS_ALL, 0, 0},
                                     {seq[2], h[2], 2, RUNNER_LOGITS_LAST, 0, 0}};
    ck_assert_msg(runner_step(r, st1, 3) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(runner_n_logits(r), 9);
    float rows[16 * V];
    ck_assert_int_eq(runner_logits(r, 0, 9, rows), BERTH_OK);
    for (int32_t i = 0; i < 5; i++) expect_counts(rows + i * V, h[0], i + 1, "step 1 seq 0", i);
    for (int32_t i = 0; i < 3; i++) expect_counts(rows + (5 + i) * V, h[1], i + 1, "step 1 seq 1", i);
    expect_counts(rows + 8 * V, h[2], 2, "step 1 seq 2", 1);
    n[0] = 5, n[1] = 3, n[2] = 2;
    /* Step 2: decode rows beside a prefill chunk, sequences out of id order. */
    struct runner_seq_step st2[3] = {{seq[2], h[2] + 2, 1, RUNNER_LOGITS_LAST, 1, 0},
                                     {seq[1], h[1] + 3, 4, RUNNER_LOGITS_ALL, 0, 0},
                                     {seq[0], h[0] + 5, 1, RUNNER_LOGITS_LAST, 1, 0}};
    ck_assert_msg(runner_step(r, st2, 3) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(runner_n_logits(r), 6);
    ck_assert_int_eq(runner_logits(r, 0, 6, rows), BERTH_OK);
    expect_counts(rows, h[2], 3, "step 2 seq 2", 2);
    for (int32_t i = 0; i < 4; i++) expect_counts(rows + (1 + i) * V, h[1], 4 + i, "step 2 seq 1", 3 + i);
    expect_counts(rows + 5 * V, h[0], 6, "step 2 seq 0", 5);
    ck_assert_int_eq(runner_stats(r)->mixed_steps, 1);
    for (int k = 0; k < 3; k++) runner_seq_free(r, seq[k]);
    (void)n;
    close_session(&s);
}
END_TEST

START_TEST(test_fork_diverges)
{
    struct session s;
    open_session(&s, 8, 3, 1 << 20, 0);
    struct runner *r = s.r;
    int32_t pa[16], pb[16], pc[16];
    fill_ids(pa, 6, 21);
    int32_t a, b, c;
    ck_assert_int_eq(runner_seq_new(r, &a), BERTH_OK);
    float rows[8 * V];
    prefill_all(r, a, pa, 6, rows);
    /* Fork after 6 tokens (a partial block: copy-on-write of the K/V, a copy of the state). */
    ck_assert_int_eq(runner_seq_fork(r, a, &b), BERTH_OK);
    memcpy(pb, pa, 6 * sizeof *pa);
    /* Parent and child get different tokens in one step, then their own histories. */
    for (int32_t i = 6; i < 10; i++) {
        pa[i] = (pa[i - 1] + 1) % V;
        pb[i] = (pa[i - 1] + 7) % V;
        struct runner_seq_step st[2] = {{a, &pa[i], 1, RUNNER_LOGITS_LAST, 1, 0}, {b, &pb[i], 1, RUNNER_LOGITS_LAST, 1, 0}};
        ck_assert_msg(runner_step(r, st, 2) == BERTH_OK, "%s", berth_last_error());
        ck_assert_int_eq(runner_logits(r, 0, 2, rows), BERTH_OK);
        expect_counts(rows, pa, i + 1, "parent after fork", i);
        expect_counts(rows + V, pb, i + 1, "child after fork", i);
    }
    /* Fork the child on a block boundary (len 10 -> fork at 10? no: fork now, at 10) and diverge again. */
    ck_assert_int_eq(runner_seq_fork(r, b, &c), BERTH_OK);
    memcpy(pc, pb, 10 * sizeof *pb);
    pb[10] = 0, pc[10] = 15;
    ck_assert_msg(runner_decode(r, c, pc[10], rows) == BERTH_OK, "%s", berth_last_error());
    expect_counts(rows, pc, 11, "grandchild", 10);
    ck_assert_msg(runner_decode(r, b, pb[10], rows) == BERTH_OK, "%s", berth_last_error());
    expect_counts(rows, pb, 11, "child after its own fork", 10);
    ck_assert_msg(runner_decode(r, a, 9, rows) == BERTH_OK, "%s", berth_last_error());
    pa[10] = 9;
    expect_counts(rows, pa, 11, "parent after the grandchild", 10);
    ck_assert_int_eq(kv_counters(runner_kv(r))->forks, 2);
    ck_assert_int_gt(kv_counters(runner_kv(r))->cow_copies, 0);
    runner_seq_free(r, a);
    runner_seq_free(r, b);
    runner_seq_free(r, c);
    ck_assert_msg(kv_cache_validate(runner_kv(r)) == BERTH_OK, "%s", berth_last_error());
    close_session(&s);
}
END_TEST

/* Attach ids[0..n) to a fresh sequence, prefill the rest with every row checked against counts of ids; returns
 * the cached tokens. The model must compute only the uncached ones. */
static int32_t attach_and_check(struct runner *r, const int32_t *ids, int32_t n, const char *what)
{
    int32_t seq, cached;
    ck_assert_int_eq(runner_seq_new(r, &seq), BERTH_OK);
    int64_t tok0 = model_counter(r, "tokens"), hit0 = kv_counters(runner_kv(r))->hit_tokens;
    int64_t stat0 = runner_stats(r)->cached_tokens;
    ck_assert_int_eq(runner_seq_attach_prefix(r, seq, ids, n, &cached), BERTH_OK);
    ck_assert_int_eq(kv_counters(runner_kv(r))->hit_tokens - hit0, cached);
    ck_assert_int_eq(runner_stats(r)->cached_tokens - stat0, cached);
    ck_assert_int_eq(runner_seq_len(r, seq), cached);
    float *rows = malloc((size_t)(n - cached) * V * sizeof *rows);
    prefill_all(r, seq, ids + cached, n - cached, rows);
    for (int32_t i = cached; i < n; i++) expect_counts(rows + (i - cached) * V, ids, i + 1, what, i);
    ck_assert_int_eq(model_counter(r, "tokens") - tok0, n - cached);
    free(rows);
    runner_seq_free(r, seq);
    return cached;
}

START_TEST(test_prefix_snapshots)
{
    struct session s;
    open_session(&s, 8, 2, 1 << 20, 4);
    struct runner *r = s.r;
    struct kv_cache *kv = runner_kv(r);
    const struct kv_cache_counters *kc = kv_counters(kv);
    /* 1. An 8-token prompt in one step ends on the boundary of block 1: one snapshot (none at block 0, inside the
     *    step). A prompt extending it restores it: 8 cached tokens, logits = counts of the whole prompt. */
    int32_t P[12];
    fill_ids(P, 12, 31);
    int32_t a;
    ck_assert_int_eq(runner_seq_new(r, &a), BERTH_OK);
    ck_assert_msg(runner_prefill(r, a, P, 8, 0, NULL) == BERTH_OK, "%s", berth_last_error());
    runner_seq_free(r, a);
    ck_assert_int_eq(kc->snapshots_saved, 1);
    ck_assert_int_eq(attach_and_check(r, P, 11, "hit after an 8-token step"), 8);
    ck_assert_int_eq(kc->snapshots_restored, 1);
    /* The same prompt shortened to share only block 0: its blocks are cached but no step ended at 4, so no hit. */
    int32_t Q[7];
    memcpy(Q, P, 4 * sizeof *Q);
    Q[4] = (P[4] + 1) % V, Q[5] = 2, Q[6] = 3;
    ck_assert_int_eq(kv_prefix_match(kv, Q, 7), 0);
    ck_assert_int_eq(attach_and_check(r, Q, 7, "block 0 without a snapshot"), 0);
    ck_assert_int_eq(kc->snapshots_restored, 1);

    /* 2. A step that does not end on a boundary saves nothing; the decode step reaching the boundary does. */
    int32_t S[10];
    fill_ids(S, 10, 32);
    int64_t saved0 = kc->snapshots_saved;
    ck_assert_int_eq(runner_seq_new(r, &a), BERTH_OK);
    ck_assert_msg(runner_prefill(r, a, S, 6, 0, NULL) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(kc->snapshots_saved, saved0);
    ck_assert_int_eq(kv_prefix_match(kv, S, 7), 0); /* block 0 is cached, its state was never saved */
    ck_assert_msg(runner_decode(r, a, S[6], NULL) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(kc->snapshots_saved, saved0);
    ck_assert_msg(runner_decode(r, a, S[7], NULL) == BERTH_OK, "%s", berth_last_error());
    ck_assert_int_eq(kc->snapshots_saved, saved0 + 1);
    /* While a is still alive (its blocks shared, its state moving on), a second sequence hits at 8. */
    ck_assert_int_eq(attach_and_check(r, S, 10, "hit at a decode-made snapshot"), 8);
    ck_assert_msg(runner_decode(r, a, S[8], NULL) == BERTH_OK, "%s", berth_last_error());
    runner_seq_free(r, a);

    /* 3. Chunked prefill in steps of 4 ends on every boundary: snapshots at 4, 8, 12 and a hit on block 0 only. */
    int32_t T[13];
    fill_ids(T, 13, 33);
    saved0 = kc->snapshots_saved;
    ck_assert_int_eq(runner_seq_new(r, &a), BERTH_OK);
    for (int32_t i = 0; i < 12; i += 4) {
        struct runner_seq_step st = {a, T + i, 4, RUNNER_LOGITS_NONE, 0, 0};
        ck_assert_msg(runner_step(r, &st, 1) == BERTH_OK, "%s", berth_last_error());
    }
    runner_seq_free(r, a);
    ck_assert_int_eq(kc->snapshots_saved, saved0 + 3);
    ck_assert_int_eq(kv_snapshots_in_use(kv), 4);
    int32_t U[6];
    memcpy(U, T, 4 * sizeof *U);
    U[4] = (T[4] + 3) % V, U[5] = 1;
    ck_assert_int_eq(attach_and_check(r, U, 6, "hit on block 0 of a chunked prefill"), 4);
    ck_assert_int_eq(attach_and_check(r, T, 13, "hit on block 2 of a chunked prefill"), 12);

    /* 4. Only 4 snapshot slots: part 3 evicted the oldest ones (part 1's and part 2's). Their KV blocks are still
     *    cached, but without the state there is no hit. */
    ck_assert_int_ge(kc->evicted_snapshots, 1);
    ck_assert_int_eq(kv_prefix_match(kv, P, 11), 0);
    ck_assert_int_eq(attach_and_check(r, P, 11, "evicted snapshot"), 0);
    ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "%s", berth_last_error());
    close_session(&s);
}
END_TEST

START_TEST(test_prefix_snapshot_fallback)
{
    struct session s;
    open_session(&s, 8, 2, 1 << 20, 2);
    struct runner *r = s.r;
    struct kv_cache *kv = runner_kv(r);
    /* Steps of 4 over 12 tokens save snapshots at 4, 8, 12; with 2 slots the one at 4 is evicted. */
    int32_t T[13], W[9];
    fill_ids(T, 13, 61);
    fill_ids(W, 9, 62);
    int32_t a;
    ck_assert_int_eq(runner_seq_new(r, &a), BERTH_OK);
    for (int32_t i = 0; i < 12; i += 4) {
        struct runner_seq_step st = {a, T + i, 4, RUNNER_LOGITS_NONE, 0, 0};
        ck_assert_msg(runner_step(r, &st, 1) == BERTH_OK, "%s", berth_last_error());
    }
    runner_seq_free(r, a);
    ck_assert_int_eq(kv_counters(kv)->evicted_snapshots, 1);
    /* Block 0 is cached but its snapshot is gone: a prompt sharing only block 0 gets nothing. */
    int32_t U[6];
    memcpy(U, T, 4 * sizeof *U);
    U[4] = (T[4] + 5) % V, U[5] = 0;
    ck_assert_int_eq(attach_and_check(r, U, 6, "evicted snapshot at 4"), 0);
    /* Use the one at 8 (now the most recent), then save another: the one at 12 is evicted. */
    int32_t T10[10];
    memcpy(T10, T, 9 * sizeof *T10);
    T10[9] = (T[9] + 1) % V;
    ck_assert_int_eq(attach_and_check(r, T10, 10, "hit at 8"), 8);
    ck_assert_int_eq(runner_seq_new(r, &a), BERTH_OK);
    ck_assert_msg(runner_prefill(r, a, W, 8, 0, NULL) == BERTH_OK, "%s", berth_last_error());
    runner_seq_free(r, a);
    ck_assert_int_eq(kv_counters(kv)->evicted_snapshots, 2); /* U and T10 ended off boundaries: no saves */
    /* All three blocks of T are cached, the snapshot at 12 is gone: the hit falls back to 8. */
    ck_assert_int_eq(attach_and_check(r, T, 13, "fallback to the snapshot at 8"), 8);
    ck_assert_msg(kv_cache_validate(kv) == BERTH_OK, "%s", berth_last_error());
    close_session(&s);
}
END_TEST

/* ---- scheduler ---- */

#define MAXR 8
#define MAXS 4
#define MAXT 40

struct rec {
    int32_t tok[MAXR][MAXS][MAXT];
    struct runner_sample_out lp[MAXR][MAXS][MAXT];
    int32_t n[MAXR][MAXS];
    int done[MAXR][MAXS];
    int32_t cached[MAXR][MAXS];
    const char *finish[MAXR][MAXS];
};

static int on_token_ex(void *arg, int64_t id, int32_t index, int32_t token, const struct runner_sample_out *lp)
{
    struct rec *o = arg;
    ck_assert(id >= 0 && id < MAXR && index >= 0 && index < MAXS);
    ck_assert_int_lt(o->n[id][index], MAXT);
    ck_assert_ptr_nonnull(lp);
    o->lp[id][index][o->n[id][index]] = *lp;
    o->tok[id][index][o->n[id][index]++] = token;
    return 0;
}

static void on_done(void *arg, int64_t id, int32_t index, const char *finish, int32_t n_tokens, int32_t cached,
                    berth_status status, const char *message)
{
    struct rec *o = arg;
    ck_assert_msg(status == BERTH_OK, "request %lld/%d failed: %s", (long long)id, (int)index, message);
    ck_assert_int_eq(n_tokens, o->n[id][index]);
    o->done[id][index] = 1;
    o->cached[id][index] = cached;
    o->finish[id][index] = finish;
}

static struct sched_request request(const int32_t *prompt, int32_t n, int32_t max_new, int32_t samples,
                                    uint64_t seed)
{
    struct sched_request rq;
    memset(&rq, 0, sizeof rq);
    rq.prompt = prompt;
    rq.n_prompt = n;
    rq.max_new = max_new;
    rq.n = samples;
    rq.sampling.temperature = 1.0f;
    rq.sampling.top_p = 1.0f;
    rq.sampling.seed = seed;
    rq.sampling.n_top = V;
    rq.logprobs = 1;
    rq.ignore_eos = 1;
    return rq;
}

static void run_all(struct scheduler *sc)
{
    for (int guard = 0; sched_pending(sc) > 0; guard++) {
        ck_assert_int_lt(guard, 2000);
        int did = 0;
        ck_assert_msg(sched_step(sc, &did) == BERTH_OK, "%s", berth_last_error());
        ck_assert(did);
    }
}

/* Every token of sample (id, k) was drawn from the counts of prompt + the sample's earlier tokens: its chosen
 * logprob and all V top logprobs equal that vector's log-softmax. */
static void check_sample(const struct rec *o, int64_t id, int32_t k, const int32_t *prompt, int32_t n_prompt,
                         int32_t max_new)
{
    ck_assert_msg(o->done[id][k], "request %lld sample %d did not finish", (long long)id, (int)k);
    ck_assert_int_eq(o->n[id][k], max_new);
    int32_t hist[128];
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    for (int32_t t = 0; t < o->n[id][k]; t++) {
        float c[V];
        counts_of(hist, n_prompt + t, c);
        double mx = c[0], sum = 0;
        for (int32_t v = 1; v < V; v++) mx = c[v] > mx ? c[v] : mx;
        for (int32_t v = 0; v < V; v++) sum += exp((double)c[v] - mx);
        double lse = mx + log(sum);
        const struct runner_sample_out *lp = &o->lp[id][k][t];
        int32_t tok = o->tok[id][k][t];
        ck_assert_msg(fabs(lp->logprob - ((double)c[tok] - lse)) <= TOL, "request %lld sample %d token %d (%d): "
                      "logprob %g, counts of its history give %g", (long long)id, (int)k, (int)t, (int)tok,
                      (double)lp->logprob, (double)c[tok] - lse);
        ck_assert_int_eq(lp->n_top, V);
        for (int32_t j = 0; j < V; j++) {
            int32_t v = lp->top_ids[j];
            ck_assert(v >= 0 && v < V);
            ck_assert_msg(fabs(lp->top_logprobs[j] - ((double)c[v] - lse)) <= TOL, "request %lld sample %d token "
                          "%d: logprob of id %d is %g, counts of its history give %g", (long long)id, (int)k, (int)t,
                          (int)v, (double)lp->top_logprobs[j], (double)c[v] - lse);
        }
        hist[n_prompt + t] = tok;
    }
}

START_TEST(test_sched_states)
{
    struct session s;
    /* Chunks of at most 6 tokens for prompts of 7..13: chunked prefill inside mixed steps. */
    open_session(&s, 6, 8, 1 << 20, 16);
    struct rec *o = calloc(1, sizeof *o);
    struct sched_callbacks cb = {NULL, on_done, o, on_token_ex};
    struct scheduler *sc;
    ck_assert_int_eq(sched_create(s.r, &cb, &sc), BERTH_OK);
    int32_t p[3][16];
    const int32_t np[3] = {10, 7, 13};
    for (int k = 0; k < 3; k++) fill_ids(p[k], np[k], 40 + (uint32_t)k);
    /* (c) three concurrent requests. */
    for (int k = 0; k < 3; k++) {
        struct sched_request rq = request(p[k], np[k], 6, 1, 100 + (uint64_t)k);
        ck_assert_msg(sched_add(sc, k, &rq) == BERTH_OK, "%s", berth_last_error());
    }
    run_all(sc);
    const struct sched_stats *ss = sched_stats(sc);
    ck_assert_int_gt(ss->mixed_steps, 0);
    ck_assert_int_eq(ss->prefill_tokens, 10 + 7 + 13);
    for (int k = 0; k < 3; k++) check_sample(o, k, 0, p[k], np[k], 6);

    /* (d) n = 4 by fork: one prefill, three forks, every sample counts its own history; the samples diverge. */
    int64_t pre0 = ss->prefill_tokens;
    struct sched_request rq = request(p[1], np[1], 8, 4, 7);
    ck_assert_int_eq(sched_add(sc, 3, &rq), BERTH_OK);
    run_all(sc);
    ck_assert_int_eq(ss->forks, 3);
    ck_assert_int_eq(ss->prefill_tokens + o->cached[3][0] - pre0, np[1]);
    int differ = 0;
    for (int32_t k = 0; k < 4; k++) {
        check_sample(o, 3, k, p[1], np[1], 8);
        if (k > 0 && memcmp(o->tok[3][k], o->tok[3][0], 8 * sizeof(int32_t)) != 0) differ = 1;
    }
    ck_assert_msg(differ, "the 4 samples drew identical tokens");

    /* (e) a follow-up of request 0: its prompt + its 6 tokens + one more. Request 0's decode step that fed its
     *     second token ended at 12, a block boundary (the last one it reached: it fed 15 tokens), so 12 are cached
     *     and the restored state makes every later row count the whole prompt. */
    int32_t f[17];
    memcpy(f, p[0], 10 * sizeof *f);
    memcpy(f + 10, o->tok[0][0], 6 * sizeof *f);
    f[16] = 5;
    int64_t hit0 = kv_counters(runner_kv(s.r))->hit_tokens, cached0 = ss->cached_tokens;
    int64_t restored0 = kv_counters(runner_kv(s.r))->snapshots_restored;
    rq = request(f, 17, 5, 1, 9);
    ck_assert_int_eq(sched_add(sc, 4, &rq), BERTH_OK);
    run_all(sc);
    ck_assert_int_eq(o->cached[4][0], 12);
    ck_assert_int_eq(ss->cached_tokens - cached0, 12);
    ck_assert_int_eq(kv_counters(runner_kv(s.r))->hit_tokens - hit0, 12);
    ck_assert_int_eq(kv_counters(runner_kv(s.r))->snapshots_restored - restored0, 1);
    check_sample(o, 4, 0, f, 17, 5);
    ck_assert_int_eq(ss->recomputed_tokens, 0);
    ck_assert_int_eq(ss->preemptions, 0);
    ck_assert_int_eq(kv_blocks_in_use(runner_kv(s.r), 0), 0);
    ck_assert_msg(kv_cache_validate(runner_kv(s.r)) == BERTH_OK, "%s", berth_last_error());
    sched_free(sc);
    free(o);
    close_session(&s);
}
END_TEST

START_TEST(test_sched_preemption)
{
    struct session s;
    /* 7 blocks of 4 tokens (1 layer x (4 + 4) f32 x 4 tokens = 128 bytes each): two requests of 4 + 16 tokens
     * (5 blocks each) are both admitted and then outgrow the cache. */
    open_session(&s, 8, 4, 7 * 128, 16);
    ck_assert_int_eq(kv_blocks_total(runner_kv(s.r), 0), 7);
    struct rec *o = calloc(1, sizeof *o);
    struct sched_callbacks cb = {NULL, on_done, o, on_token_ex};
    struct scheduler *sc;
    ck_assert_int_eq(sched_create(s.r, &cb, &sc), BERTH_OK);
    int32_t p[2][4];
    for (int k = 0; k < 2; k++) fill_ids(p[k], 4, 50 + (uint32_t)k);
    for (int k = 0; k < 2; k++) {
        struct sched_request rq = request(p[k], 4, 16, 1, 200 + (uint64_t)k);
        ck_assert_msg(sched_add(sc, k, &rq) == BERTH_OK, "%s", berth_last_error());
    }
    run_all(sc);
    const struct sched_stats *ss = sched_stats(sc);
    ck_assert_int_gt(ss->preemptions, 0);
    /* The victim's prefix is gone by re-admission: kv_seq_free returns blocks to the LRU list first block first,
     * so the preempting request's next block evicts the victim's block 0 and the whole chain with it. */
    ck_assert_int_gt(ss->recomputed_tokens, 0);
    for (int k = 0; k < 2; k++) check_sample(o, k, 0, p[k], 4, 16);
    /* The same seeds alone give the same tokens. */
    struct rec *alone = calloc(1, sizeof *alone);
    struct sched_callbacks cb2 = {NULL, on_done, alone, on_token_ex};
    struct scheduler *sc2;
    ck_assert_int_eq(sched_create(s.r, &cb2, &sc2), BERTH_OK);
    for (int k = 0; k < 2; k++) {
        struct sched_request rq = request(p[k], 4, 16, 1, 200 + (uint64_t)k);
        ck_assert_int_eq(sched_add(sc2, k, &rq), BERTH_OK);
        run_all(sc2);
        check_sample(alone, k, 0, p[k], 4, 16);
        ck_assert_msg(memcmp(alone->tok[k][0], o->tok[k][0], 16 * sizeof(int32_t)) == 0,
                      "request %d: preempted tokens differ from a lone run", k);
    }
    ck_assert_int_eq(kv_blocks_in_use(runner_kv(s.r), 0), 0);
    ck_assert_msg(kv_cache_validate(runner_kv(s.r)) == BERTH_OK, "%s", berth_last_error());
    sched_free(sc2);
    sched_free(sc);
    free(alone);
    free(o);
    close_session(&s);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s BUILD/plugins BUILD/tests/state_model\n", argv[0]);
        return 2;
    }
    plugin_dir = argv[1];
    state_dir = argv[2];
    Suite *su = suite_create("engine_recurrent_state");
    TCase *tc = tcase_create("state");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_zero_carry_chunked);
    tcase_add_test(tc, test_concurrent_mixed);
    tcase_add_test(tc, test_fork_diverges);
    tcase_add_test(tc, test_prefix_snapshots);
    tcase_add_test(tc, test_prefix_snapshot_fallback);
    tcase_add_test(tc, test_sched_states);
    tcase_add_test(tc, test_sched_preemption);
    suite_add_tcase(su, tc);
    return check_run(su, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

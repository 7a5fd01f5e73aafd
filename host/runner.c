/* runner.c — loads a model plugin on a backend and runs batched forward steps over the paged KV cache (see
 * runner.h). */
#include "runner.h"
#include "host_services.h"

#include "errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Cap on the logits buffer when all prompt rows are wanted: prefill chunks shrink so [rows x vocab] f32 stays
 * under it (a 262144-entry vocabulary gives 256-row chunks). */
#define LOGITS_BUDGET_BYTES (256ull << 20)
#define META_ALIGN 256u

struct runner {
    struct runner_config cfg;
    const berth_backend_api *be;
    berth_model_info info;
    berth_memory_layout layout;
    struct kv_cache *kv;
    berth_stream *stream;
    int32_t max_tokens;
    int32_t max_seqs;
    int32_t table_cap;        /* block-table entries per sequence (max blocks per sequence) */
    berth_dtype kv_dtype;     /* element type of the KV pools */
    /* Decode steps as replayed backend graphs (BERTH_CAP_GRAPHS + a graph_safe model): one graph per padded
     * batch size ("bucket"), recorded the second time that size runs (the first, eager run sizes every workspace)
     * and replayed afterwards with new contents in the same metadata buffers. */
    int graphs;
    berth_graph **graph;      /* [(max_seqs + 1) * RUNNER_GRAPH_WIDTHS], by bucket size and table-width level */
    uint8_t *graph_seen;      /* same shape: the (bucket, width) ran eagerly once */

    /* One metadata buffer: the step area, where each step packs its arrays from offset 0 (step_layout: the
     * offsets below change with the step's sizes, and are the same for every step of one graph key) so that one
     * copy sends them all; then the sampled outputs at fixed offsets. The h_* arrays live in a host mirror of the
     * step area at the same offsets (pinned when staged, else on the heap: host_mirror). */
    berth_buffer *meta;
    uint64_t off_tokens, off_positions, off_q_start, off_kv_len, off_logit_rows, off_state_slots, off_ids, off_lp, off_top_ids, off_top_lp;
    uint64_t *off_table, *off_slots; /* per KV group */
    int32_t *h_tokens, *h_positions, *h_q_start, *h_kv_len, *h_logit_rows, *h_state_slots;
    uint64_t step_cap;        /* bytes of the step area at its largest */
    uint64_t off_tables;      /* where this step's block tables begin (after every other array) */
    char *host_mirror;        /* !staged: the heap mirror of the step area */
    /* On an asynchronous backend whose staging buffers are host-addressable, the step metadata is written straight
     * into one of two pinned mirrors of `meta` (same offsets) and sent with asynchronous copies: no pageable
     * transfers, and the host fills step N+1's mirror while step N's copies may still be in flight. A mirror is
     * reused only after a stream sync has passed since its last use (decode steps sync every step anyway). */
    int staged;
    berth_buffer *stage[2];
    char *stage_ptr[2];
    int64_t stage_serial[2];  /* the step whose metadata the mirror last held; 0 = never used */
    int stage_cur;
    int64_t syncs;            /* stream syncs the runner has made */
    int64_t serial;           /* steps started (runner_step calls that enqueued work) */
    int64_t done_serial;      /* every step up to this one has finished on the device */

    /* Sampled outputs, one slot per step that may be in flight (runner.h, "Overlap"): on an asynchronous backend
     * with events and staging memory they land in a pinned mirror by an asynchronous copy and an event marks
     * their arrival; otherwise they are downloaded at once into host arrays. */
    int feed;                 /* runner_can_feed */
    int32_t fed_rows;         /* rows the last sample launch left in meta's ids section */
    int async_out;            /* the pinned-mirror path */
    struct out_slot {
        berth_buffer *stage;  /* async_out: pinned, laid out as meta's off_ids..off_top_lp section */
        char *ptr;
        berth_event *ev;
        int32_t *ids, *top_ids; /* !async_out: host copies */
        int32_t *row_ntop;    /* top logprobs each row asked for */
        float *lp, *top_lp;
        int32_t n_rows, n_top;
        int want_lp;
        int64_t serial;       /* the step these rows belong to; 0 = empty */
        int launched;
    } out[RUNNER_SAMPLE_SLOTS];
    struct kv_seq_span *spans;
    berth_kv_group_batch *gb;

    berth_state_batch *sb;    /* views of the KV cache's recurrent-state pools */

    berth_buffer *logits;
    int32_t logits_rows;      /* rows the logits buffer holds */
    int32_t logits_rows_max;  /* LOGITS_BUDGET_BYTES / row, at least 1, at most max_tokens */
    int32_t n_logits;         /* rows the last step produced */
    int loaded;

    struct runner_stats stats;
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int32_t dtype_size(berth_dtype t)
{
    switch (t) {
    case BERTH_DTYPE_F32:
    case BERTH_DTYPE_I32: return 4;
    case BERTH_DTYPE_F16:
    case BERTH_DTYPE_BF16: return 2;
    case BERTH_DTYPE_I64: return 8;
    case BERTH_DTYPE_U8: return 1;
    default: return 0;
    }
}

/* A packed tensor of up to 4 dims (ne beyond n_dims = 1) at buf + offset. */
static berth_tensor tensor_at(berth_buffer *buf, uint64_t offset, berth_dtype dt, int32_t n_dims, const int64_t *ne)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.buf = buf;
    t.offset = offset;
    t.dtype = dt;
    t.ndim = n_dims;
    for (int i = 0; i < 4; i++) t.ne[i] = i < n_dims ? ne[i] : 1;
    t.nb[0] = dtype_size(dt);
    for (int i = 1; i < 4; i++) t.nb[i] = t.nb[i - 1] * t.ne[i - 1];
    return t;
}

static berth_tensor tensor_1d(berth_buffer *buf, uint64_t offset, berth_dtype dt, int64_t n)
{
    int64_t ne[1] = {n};
    return tensor_at(buf, offset, dt, 1, ne);
}

static berth_tensor tensor_2d(berth_buffer *buf, uint64_t offset, berth_dtype dt, int64_t n0, int64_t n1)
{
    int64_t ne[2] = {n0, n1};
    return tensor_at(buf, offset, dt, 2, ne);
}

/* Keep the backend's message but say which step failed. */
static berth_status fail_with_backend(berth_status st, const char *what)
{
    char inner[768];
    snprintf(inner, sizeof inner, "%s", berth_last_error());
    return berth_fail(st, "%s: %s", what, inner[0] ? inner : berth_status_str(st));
}

/* A decode graph is recorded for a batch size and a block-table width: the attention kernels size their work
 * from the table's width while recording (berth/backend.h), so the width is bucketed to powers of two from
 * RUNNER_GRAPH_MIN_WIDTH blocks, and a step uses the graph of the smallest width that holds its longest sequence.
 * (The full per-sequence width, max_positions / block_size, would make every short step pay for 128k keys.) */
#define RUNNER_GRAPH_WIDTHS 24
#define RUNNER_GRAPH_MIN_WIDTH 16

static void drop_graphs(struct runner *r)
{
    if (!r->graph) return;
    for (int32_t b = 0; b < (r->max_seqs + 1) * RUNNER_GRAPH_WIDTHS; b++) {
        if (r->graph[b]) r->be->vt->graph_destroy(r->be->be, r->graph[b]);
        r->graph[b] = NULL;
        r->graph_seen[b] = 0;
    }
}

/* The heap mirror of the step area (alloc_meta); gone once the pinned mirrors take its place. */
static void free_host_meta(struct runner *r)
{
    free(r->host_mirror);
    r->host_mirror = NULL;
}

static void setup_staging(struct runner *r, uint64_t bytes);
static berth_status stage_select(struct runner *r);
static berth_status alloc_out_slots(struct runner *r);
static void free_out_slots(struct runner *r);

static berth_status sync_stream(struct runner *r)
{
    berth_status st = r->be->vt->stream_sync(r->be->be, r->stream);
    if (!st) {
        r->syncs++;
        r->done_serial = r->serial;
    }
    return st;
}

static berth_status alloc_logits(struct runner *r, int32_t rows)
{
    if (rows <= r->logits_rows) return BERTH_OK;
    if (r->logits) {
        /* Nothing may still read the old buffer, and no recorded graph may write it. */
        berth_status st = sync_stream(r);
        if (st) return fail_with_backend(st, "stream sync");
        drop_graphs(r);
        r->be->vt->buffer_free(r->be->be, r->logits);
        r->logits = NULL;
        r->logits_rows = 0;
    }
    uint64_t bytes = (uint64_t)rows * (uint64_t)r->info.vocab_size * sizeof(float);
    berth_status st = r->be->vt->buffer_alloc(r->be->be, bytes, BERTH_USAGE_ACTIVATIONS, &r->logits);
    if (st) {
        r->logits = NULL;
        char what[128];
        snprintf(what, sizeof what, "cannot allocate the logits buffer (%llu bytes)", (unsigned long long)bytes);
        return fail_with_backend(st, what);
    }
    r->logits_rows = rows;
    return BERTH_OK;
}

static uint64_t align_up(uint64_t x) { return (x + META_ALIGN - 1) / META_ALIGN * META_ALIGN; }

/* This step's offsets in the step area: tokens, positions, q_start, kv_len, logit_rows, state_slots, the slots of
 * each KV group, then (step_tables, once the width is known) the block table of each group. Every array at its
 * largest gives alloc_meta's capacity, so any step fits. */
static void step_layout(struct runner *r, int32_t tok, int32_t n_seqs, int32_t n_logits)
{
    uint64_t off = 0;
    r->off_tokens = off, off = align_up(off + (uint64_t)tok * 4);
    r->off_positions = off, off = align_up(off + (uint64_t)tok * 4);
    r->off_q_start = off, off = align_up(off + (uint64_t)(n_seqs + 1) * 4);
    r->off_kv_len = off, off = align_up(off + (uint64_t)n_seqs * 4);
    r->off_logit_rows = off, off = align_up(off + (uint64_t)n_logits * 4);
    r->off_state_slots = off, off = align_up(off + (uint64_t)n_seqs * 4);
    for (int32_t g = 0; g < r->layout.n_kv_groups; g++) r->off_slots[g] = off, off = align_up(off + (uint64_t)tok * 4);
    r->off_tables = off;
}

/* The block tables' offsets (width entries per sequence); returns the end of the step's arrays. */
static uint64_t step_tables(struct runner *r, int32_t width, int32_t n_seqs)
{
    uint64_t off = r->off_tables;
    for (int32_t g = 0; g < r->layout.n_kv_groups; g++)
        r->off_table[g] = off, off = align_up(off + (uint64_t)width * (uint64_t)n_seqs * 4);
    return off;
}

static berth_status alloc_meta(struct runner *r)
{
    int32_t ng = r->layout.n_kv_groups;
    uint64_t S = (uint64_t)r->max_seqs;
    r->off_table = calloc((size_t)(ng ? ng : 1), sizeof *r->off_table);
    r->off_slots = calloc((size_t)(ng ? ng : 1), sizeof *r->off_slots);
    r->gb = calloc((size_t)(ng ? ng : 1), sizeof *r->gb);
    if (!r->off_table || !r->off_slots || !r->gb) return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    /* the step area's capacity: the layout of the largest step (every size at its bound) */
    step_layout(r, r->max_tokens, r->max_seqs, r->max_tokens);
    uint64_t off = step_tables(r, r->table_cap, r->max_seqs);
    r->step_cap = off;
    r->off_ids = off, off = align_up(off + S * 4);
    r->off_lp = off, off = align_up(off + S * 4);
    r->off_top_ids = off, off = align_up(off + S * RUNNER_MAX_TOP_LOGPROBS * 4);
    r->off_top_lp = off, off = align_up(off + S * RUNNER_MAX_TOP_LOGPROBS * 4);
    r->host_mirror = calloc(1, r->step_cap); /* its padding is uploaded too: defined bytes */
    r->spans = malloc(S * sizeof *r->spans);
    if (!r->host_mirror || !r->spans) return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    berth_status st = r->be->vt->buffer_alloc(r->be->be, off, BERTH_USAGE_ACTIVATIONS, &r->meta);
    if (st) {
        r->meta = NULL;
        return fail_with_backend(st, "cannot allocate the step metadata buffer");
    }
    setup_staging(r, off);
    return BERTH_OK;
}

/* The pinned mirrors (see struct runner). Optional: without them (synchronous backend, no host-addressable staging
 * memory, or an allocation that fails) the h_* arrays stay in the heap mirror and go up with buffer_upload. */
static void setup_staging(struct runner *r, uint64_t bytes)
{
    const berth_backend_vtable *vt = r->be->vt;
    if (!r->be->device || !(r->be->device->caps & BERTH_CAP_ASYNC) || !vt->buffer_host_ptr) return;
    for (int k = 0; k < 2; k++) {
        void *p = NULL;
        if (vt->buffer_alloc(r->be->be, bytes, BERTH_USAGE_STAGING, &r->stage[k]) != BERTH_OK) r->stage[k] = NULL;
        if (!r->stage[k] || vt->buffer_host_ptr(r->be->be, r->stage[k], &p) != BERTH_OK || !p) {
            for (int j = 0; j <= k; j++) {
                if (r->stage[j]) vt->buffer_free(r->be->be, r->stage[j]);
                r->stage[j] = NULL;
            }
            berth_clear_error();
            return;
        }
        r->stage_ptr[k] = p;
        r->stage_serial[k] = 0;
    }
    free_host_meta(r);
    r->staged = 1;
    r->stage_cur = 1;
    (void)stage_select(r); /* cannot fail: no mirror was used yet */
    r->stage_serial[0] = r->stage_serial[1] = 0;
}

/* This step's host mirror of the step area: the current pinned one (stage_select) or the heap one. */
static char *step_mirror(const struct runner *r) { return r->staged ? r->stage_ptr[r->stage_cur] : r->host_mirror; }

/* The step's arrays into this step's mirror (stage_select, step_layout): pointers at the current offsets. */
static void point_into_mirror(struct runner *r)
{
    char *base = step_mirror(r);
    r->h_tokens = (int32_t *)(base + r->off_tokens);
    r->h_positions = (int32_t *)(base + r->off_positions);
    r->h_q_start = (int32_t *)(base + r->off_q_start);
    r->h_kv_len = (int32_t *)(base + r->off_kv_len);
    r->h_logit_rows = (int32_t *)(base + r->off_logit_rows);
    r->h_state_slots = (int32_t *)(base + r->off_state_slots);
}

/* Switch the coming step to the other pinned mirror, after making sure its last copies are done: the step that
 * used it has finished (a stream sync or a collected sample since says so), else wait for the stream. */
static berth_status stage_select(struct runner *r)
{
    if (!r->staged) return BERTH_OK;
    int k = 1 - r->stage_cur;
    if (r->stage_serial[k] > r->done_serial) {
        berth_status st = sync_stream(r);
        if (st) return fail_with_backend(st, "stream sync");
    }
    r->stage_cur = k;
    r->stage_serial[k] = r->serial + 1; /* the step about to be built */
    return BERTH_OK;
}

/* Tensor views of the KV cache's recurrent-state pools (slot = sequence id, outermost). */
static berth_status alloc_states(struct runner *r)
{
    int32_t ns = kv_n_states(r->kv);
    if (ns <= 0) return BERTH_OK;
    r->sb = calloc((size_t)ns, sizeof *r->sb);
    if (!r->sb) return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    for (int32_t i = 0; i < ns; i++) {
        const berth_state_desc *d = kv_state_desc(r->kv, i);
        int64_t ne[4] = {1, 1, 1, 1};
        for (int j = 0; j < d->ndim; j++) ne[j] = d->ne[j];
        ne[d->ndim] = r->max_seqs;
        r->sb[i].pool = tensor_at(kv_state_pool(r->kv, i), 0, d->dtype, d->ndim + 1, ne);
    }
    return BERTH_OK;
}

berth_status runner_create(const struct runner_config *cfg, struct runner **out)
{
    *out = NULL;
    if (cfg->max_batch_tokens < 1)
        return berth_fail(BERTH_E_INVALID, "[scheduler] max_batch_tokens = %d must be at least 1",
                          (int)cfg->max_batch_tokens);
    if (cfg->max_seqs < 1)
        return berth_fail(BERTH_E_INVALID, "[scheduler] max_seqs = %d must be at least 1", (int)cfg->max_seqs);
    struct runner *r = calloc(1, sizeof *r);
    if (!r) return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    r->cfg = *cfg;
    r->be = cfg->be;
    r->max_tokens = cfg->max_batch_tokens;
    r->max_seqs = cfg->max_seqs;
    const berth_model_vtable *mvt = cfg->mvt;
    berth_status st;

    r->info.struct_size = sizeof r->info;
    st = mvt->info(cfg->model, &r->info);
    if (st) goto fail;
    if (r->info.vocab_size < 1 || r->info.max_positions < 1) {
        st = berth_fail(BERTH_E_INVALID, "model reports vocab_size %d and max_positions %d",
                        (int)r->info.vocab_size, (int)r->info.max_positions);
        goto fail;
    }
    if (r->info.n_eos < 0 || r->info.n_eos > 8) r->info.n_eos = r->info.n_eos < 0 ? 0 : 8;
    r->layout.struct_size = sizeof r->layout;
    st = mvt->memory_layout(cfg->model, &r->layout);
    if (st) goto fail;

    /* The stream exists before load(): the model does its load-time transfers on it (berth_load_params). */
    st = r->be->vt->stream_create(r->be->be, &r->stream);
    if (st) {
        r->stream = NULL;
        st = fail_with_backend(st, "cannot create a stream");
        goto fail;
    }

    /* The KV element type: the config's, or the backend's preference; it must be one the device lists. */
    berth_dtype kv_dtype = BERTH_DTYPE_F32;
    if (cfg->kv_dtype >= 0)
        kv_dtype = (berth_dtype)cfg->kv_dtype;
    else if (r->be->device && BERTH_HAS(r->be->device, berth_device_info, preferred_kv_dtype))
        kv_dtype = r->be->device->preferred_kv_dtype;
    if (kv_dtype != BERTH_DTYPE_F32 && kv_dtype != BERTH_DTYPE_BF16 && kv_dtype != BERTH_DTYPE_F16) {
        st = berth_fail(BERTH_E_INVALID, "[kv] dtype: the backend asks for KV dtype %d, not one of f32, bf16, f16",
                        (int)kv_dtype);
        goto fail;
    }
    /* (A device that lists no KV dtypes at all, such as a test double, is not second-guessed.) */
    if (r->be->device && r->be->device->kv_dtypes && !(r->be->device->kv_dtypes & BERTH_DTYPE_BIT(kv_dtype))) {
        static const char *const names[] = {"f32", "f16", "bf16"};
        st = berth_fail(BERTH_E_UNSUPPORTED, "[kv] dtype = %s is not supported by the backend's device %s",
                        names[kv_dtype], r->be->device->name);
        goto fail;
    }
    r->kv_dtype = kv_dtype;

    berth_load_params lp;
    memset(&lp, 0, sizeof lp);
    lp.struct_size = sizeof lp;
    lp.max_batch_tokens = r->max_tokens;
    lp.max_seqs = r->max_seqs;
    lp.act_dtype = BERTH_DTYPE_F32;
    lp.kv_dtype = kv_dtype;
    lp.checkpoint = cfg->ck;
    lp.stream = r->stream;
    st = mvt->load(cfg->model, r->be, &lp);
    if (st) goto fail;
    r->loaded = 1;

    struct kv_cache_params kp;
    memset(&kp, 0, sizeof kp);
    kp.block_size = cfg->kv_block_size;
    kp.memory_bytes = cfg->kv_memory;
    kp.max_seqs = r->max_seqs;
    kp.max_seq_len = r->info.max_positions;
    kp.max_chunk = r->max_tokens;
    kp.dtype = kv_dtype;
    kp.n_snapshots = r->layout.n_states > 0 ? cfg->state_snapshots : 0;
    st = kv_cache_create(r->be, &r->layout, &kp, &r->kv);
    if (st) goto fail;
    kv_cache_set_stream(r->kv, r->stream);
    r->table_cap = r->layout.n_kv_groups > 0 ? kv_max_blocks_per_seq(r->kv, 0) : 1;

    st = alloc_meta(r);
    if (st) goto fail;
    st = alloc_states(r);
    if (st) goto fail;
    st = alloc_out_slots(r);
    if (st) goto fail;
    uint64_t row_bytes = (uint64_t)r->info.vocab_size * sizeof(float);
    uint64_t max_rows = LOGITS_BUDGET_BYTES / row_bytes;
    if (max_rows < 1) max_rows = 1;
    if (max_rows > (uint64_t)r->max_tokens) max_rows = (uint64_t)r->max_tokens;
    r->logits_rows_max = (int32_t)max_rows;
    st = alloc_logits(r, r->max_seqs < r->logits_rows_max ? r->max_seqs : r->logits_rows_max);
    if (st) goto fail;
    const berth_backend_vtable *vt = r->be->vt;
    if (!cfg->no_graphs && r->be->device && (r->be->device->caps & BERTH_CAP_GRAPHS) &&
        BERTH_HAS(vt, berth_backend_vtable, graph_destroy) && vt->graph_begin && vt->graph_end && vt->graph_launch &&
        vt->graph_destroy && BERTH_HAS(&r->info, berth_model_info, graph_safe) && r->info.graph_safe &&
        r->layout.n_states == 0 && r->logits_rows >= r->max_seqs) {
        r->graph = calloc(((size_t)r->max_seqs + 1) * RUNNER_GRAPH_WIDTHS, sizeof *r->graph);
        r->graph_seen = calloc(((size_t)r->max_seqs + 1) * RUNNER_GRAPH_WIDTHS, 1);
        if (!r->graph || !r->graph_seen) {
            st = berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
            goto fail;
        }
        r->graphs = 1;
    }
    *out = r;
    return BERTH_OK;
fail:
    runner_free(r);
    return st;
}

void runner_free(struct runner *r)
{
    if (!r) return;
    const berth_backend_api *be = r->be;
    if (r->stream) be->vt->stream_sync(be->be, r->stream);
    drop_graphs(r);
    free(r->graph);
    free(r->graph_seen);
    free_out_slots(r);
    if (r->logits) be->vt->buffer_free(be->be, r->logits);
    if (r->meta) be->vt->buffer_free(be->be, r->meta);
    kv_cache_free(r->kv);
    if (r->stream) be->vt->stream_destroy(be->be, r->stream);
    free(r->sb);
    free(r->off_table);
    free(r->off_slots);
    free(r->gb);
    for (int k = 0; k < 2; k++)
        if (r->stage[k]) be->vt->buffer_free(be->be, r->stage[k]);
    free_host_meta(r); /* NULL once the pinned mirrors took its place */
    free(r->spans);
    free(r);
}

const berth_model_info *runner_info(const struct runner *r) { return &r->info; }
struct kv_cache *runner_kv(struct runner *r) { return r->kv; }
const struct runner_stats *runner_stats(const struct runner *r) { return &r->stats; }
int32_t runner_n_logits(const struct runner *r) { return r->n_logits; }
int32_t runner_max_batch_tokens(const struct runner *r) { return r->max_tokens; }
int32_t runner_max_seqs(const struct runner *r) { return r->max_seqs; }

berth_status runner_model_counters(const struct runner *r, berth_counter *out, int32_t cap, int32_t *n)
{
    *n = 0;
    const berth_model_vtable *mvt = r->cfg.mvt;
    if (!BERTH_HAS(mvt, berth_model_vtable, counters) || !mvt->counters) return BERTH_OK;
    return mvt->counters(r->cfg.model, out, cap, n);
}

berth_status runner_check_prompt(const berth_model_info *info, const char *model_dir, const int32_t *ids,
                                 int32_t n, int32_t max_new)
{
    if (n < 1) return berth_fail(BERTH_E_INVALID, "the prompt is empty (give at least one token id)");
    if (max_new < 0) return berth_fail(BERTH_E_INVALID, "max new tokens = %d must not be negative", (int)max_new);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= info->vocab_size)
            return berth_fail(BERTH_E_INVALID, "token id %d at prompt position %d is outside the vocabulary (size %d)",
                              (int)ids[i], (int)i, (int)info->vocab_size);
    if ((int64_t)n + max_new > info->max_positions)
        return berth_fail(BERTH_E_INVALID,
                          "prompt of %d tokens + %d new tokens exceeds the context limit of %d "
                          "(max_position_embeddings in %s/config.json)",
                          (int)n, (int)max_new, (int)info->max_positions, model_dir ? model_dir : ".");
    return BERTH_OK;
}

berth_status runner_seq_new(struct runner *r, int32_t *seq)
{
    return kv_seq_new(r->kv, seq);
}

berth_status runner_seq_fork(struct runner *r, int32_t src, int32_t *dst) { return kv_seq_fork(r->kv, src, dst); }

void runner_seq_abandon(struct runner *r, int32_t seq, int32_t cached)
{
    kv_prefix_attach_undo_counters(r->kv, cached);
    if (cached > 0) r->stats.cached_tokens -= cached;
    runner_seq_free(r, seq);
}

berth_status runner_seq_attach_prefix(struct runner *r, int32_t seq, const int32_t *ids, int32_t n, int32_t *cached)
{
    berth_status st = kv_prefix_attach(r->kv, seq, ids, n, cached);
    if (!st) r->stats.cached_tokens += *cached;
    return st;
}

void runner_seq_free(struct runner *r, int32_t seq) { kv_seq_free(r->kv, seq); }
int32_t runner_seq_len(const struct runner *r, int32_t seq) { return kv_seq_len(r->kv, seq); }

/* The step's arrays, [0, bytes) of the mirror, to the device in one transfer: each stream operation costs a few
 * microseconds of device time between two decode steps whatever its size (ten copies of a few bytes each were
 * ~25 us of a 1.9 ms batch-1 step on an H200), so the arrays are packed and sent together, padding included. */
static berth_status send_step(struct runner *r, uint64_t bytes)
{
    berth_status st;
    if (r->staged) /* asynchronous pinned -> device copy */
        st = r->be->vt->buffer_copy(r->be->be, r->stream, r->meta, 0, r->stage[r->stage_cur], 0, bytes);
    else
        st = r->be->vt->buffer_upload(r->be->be, r->stream, r->meta, 0, r->host_mirror, bytes);
    return st ? fail_with_backend(st, "cannot upload step metadata") : BERTH_OK;
}

static void note_kv_peak(struct runner *r)
{
    int32_t ng = kv_n_groups(r->kv);
    for (int32_t g = 0; g < ng && g < 8; g++) {
        int32_t u = kv_blocks_in_use(r->kv, g);
        if (u > r->stats.kv_peak_blocks[g]) r->stats.kv_peak_blocks[g] = u;
    }
}

/* Padded batch size for a decode step of n sequences: 1, 2, 4, then multiples of 8 (as vLLM's capture sizes), at
 * most max_seqs; 0 (no graph) if that exceeds max_batch_tokens. */
static int32_t graph_bucket(const struct runner *r, int32_t n)
{
    int32_t b = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : (n + 7) / 8 * 8;
    if (b > r->max_seqs) b = r->max_seqs;
    return b <= r->max_tokens ? b : 0;
}

/* forward() eagerly, or through the bucket's graph: recorded on the bucket's second run, replayed after that. A
 * recording that fails turns graphs off for the runner (with a warning) and runs the step eagerly. */
static berth_status run_forward(struct runner *r, const berth_batch *b, int32_t bucket, int32_t key)
{
    const berth_backend_vtable *vt = r->be->vt;
    berth_backend *be = r->be->be;
    berth_status st;
    if (bucket && r->graph[key]) {
        st = vt->graph_launch(be, r->stream, r->graph[key]);
        if (st) return fail_with_backend(st, "cannot replay a decode graph");
        r->stats.graph_replays++;
        return BERTH_OK;
    }
    if (bucket && r->graph_seen[key]) {
        st = vt->graph_begin(be, r->stream);
        if (!st) {
            berth_status fst = r->cfg.mvt->forward(r->cfg.model, r->stream, b);
            berth_graph *g = NULL;
            st = vt->graph_end(be, r->stream, &g);
            if (!fst && !st) {
                r->graph[key] = g;
                r->stats.graph_captures++;
                r->stats.forward_calls++;
                st = vt->graph_launch(be, r->stream, g);
                return st ? fail_with_backend(st, "cannot launch a decode graph") : BERTH_OK;
            }
            if (g) vt->graph_destroy(be, g);
            if (fst) st = fst;
        }
        host_log(BERTH_LOG_WARN, "decode graphs turned off: recording a %d-sequence step failed: %s", (int)bucket,
                 berth_last_error());
        drop_graphs(r);
        r->graphs = 0;
    }
    st = r->cfg.mvt->forward(r->cfg.model, r->stream, b);
    r->stats.forward_calls++;
    if (!st && bucket) r->graph_seen[key] = 1;
    return st;
}

berth_status runner_step(struct runner *r, const struct runner_seq_step *steps, int32_t n_seqs)
{
    r->n_logits = 0;
    if (n_seqs < 1 || n_seqs > r->max_seqs)
        return berth_fail(BERTH_E_INVALID, "a step needs 1..%d sequences, got %d", (int)r->max_seqs, (int)n_seqs);
    int64_t total = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const struct runner_seq_step *s = &steps[i];
        if (s->n < 1) return berth_fail(BERTH_E_INVALID, "sequence %d: a step needs at least one token", (int)s->seq);
        for (int32_t j = 0; j < i; j++)
            if (steps[j].seq == s->seq)
                return berth_fail(BERTH_E_INVALID, "sequence %d appears twice in one step", (int)s->seq);
        total += s->n;
    }
    if (total > r->max_tokens)
        return berth_fail(BERTH_E_INVALID, "a step of %lld tokens exceeds [scheduler] max_batch_tokens = %d",
                          (long long)total, (int)r->max_tokens);
    int n_fed = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const struct runner_seq_step *s = &steps[i];
        int32_t len = kv_seq_len(r->kv, s->seq);
        if (!s->ids) {
            /* fed from the device: the last sample launch's row feed_row (runner.h, "Overlap") */
            if (!r->feed)
                return berth_fail(BERTH_E_INVALID, "sequence %d: a step fed from the device needs overlap (the "
                                  "model's h_tokens_optional and the backend's sample op)", (int)s->seq);
            if (s->n != 1 || s->feed_row < 0 || s->feed_row >= r->fed_rows)
                return berth_fail(BERTH_E_INVALID, "sequence %d: a fed step takes 1 token from a sampled row in "
                                  "0..%d (got %d tokens from row %d)", (int)s->seq, (int)r->fed_rows - 1, (int)s->n,
                                  (int)s->feed_row);
            n_fed++;
        }
        for (int32_t k = 0; s->ids && k < s->n; k++)
            if (s->ids[k] < 0 || s->ids[k] >= r->info.vocab_size)
                return berth_fail(BERTH_E_INVALID, "token id %d at position %d is outside the vocabulary (size %d)",
                                  (int)s->ids[k], (int)(len + k), (int)r->info.vocab_size);
        if ((int64_t)len + s->n > r->info.max_positions)
            return berth_fail(BERTH_E_INVALID, "sequence %d would reach %lld tokens, past the context limit of %d",
                              (int)s->seq, (long long)len + s->n, (int)r->info.max_positions);
    }

    /* A pure decode step may run as a graph: padded to its bucket with rows that see no key and store nothing. */
    int32_t bucket = 0;
    if (r->graphs) {
        int all_decode = 1;
        for (int32_t i = 0; i < n_seqs; i++)
            if (steps[i].n != 1 || steps[i].logits != RUNNER_LOGITS_LAST) all_decode = 0;
        if (all_decode) bucket = graph_bucket(r, n_seqs);
    }

    berth_status sst = stage_select(r);
    if (sst) return sst;
    r->serial++;
    {
        int32_t pad = bucket > n_seqs ? bucket - n_seqs : 0, nl = pad;
        for (int32_t i = 0; i < n_seqs; i++)
            nl += steps[i].logits == RUNNER_LOGITS_ALL ? steps[i].n : steps[i].logits == RUNNER_LOGITS_LAST ? 1 : 0;
        step_layout(r, (int32_t)total + pad, n_seqs + pad, nl);
        point_into_mirror(r);
    }

    /* Reserve KV blocks, then lay the step out. */
    int32_t n_logits = 0, max_q = 0, max_kv = 0, tok = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        const struct runner_seq_step *s = &steps[i];
        int32_t start = kv_seq_len(r->kv, s->seq);
        berth_status st = kv_seq_ensure(r->kv, s->seq, start + s->n);
        if (st) return st;
        r->spans[i].seq = s->seq;
        r->spans[i].start = start;
        r->spans[i].n = s->n;
        r->h_q_start[i] = tok;
        r->h_kv_len[i] = start + s->n;
        r->h_state_slots[i] = s->seq;
        for (int32_t k = 0; k < s->n; k++) {
            r->h_tokens[tok + k] = s->ids ? s->ids[k] : 0; /* fed: overwritten on the device below */
            r->h_positions[tok + k] = start + k;
        }
        if (s->logits == RUNNER_LOGITS_ALL)
            for (int32_t k = 0; k < s->n; k++) r->h_logit_rows[n_logits++] = tok + k;
        else if (s->logits == RUNNER_LOGITS_LAST)
            r->h_logit_rows[n_logits++] = tok + s->n - 1;
        tok += s->n;
        if (s->n > max_q) max_q = s->n;
        if (start + s->n > max_kv) max_kv = start + s->n;
    }
    const int32_t n_real = n_seqs, n_real_logits = n_logits, tok_real = tok;
    for (int32_t i = n_seqs; i < bucket; i++) {
        r->h_q_start[i] = tok;
        r->h_kv_len[i] = 0;
        r->h_state_slots[i] = 0;
        r->h_tokens[tok] = 0;
        r->h_positions[tok] = 0;
        r->h_logit_rows[n_logits++] = tok;
        tok++;
    }
    if (bucket > n_seqs) n_seqs = bucket;
    r->h_q_start[n_seqs] = tok;
    note_kv_peak(r);

    berth_status st = alloc_logits(r, n_logits);
    if (st) return st;

    /* A graph replays with the block table's shape it was recorded with: a power-of-two width level. */
    int32_t width = kv_batch_table_width(r->kv, r->spans, n_real), graph_key = 0;
    if (bucket) {
        int32_t w = RUNNER_GRAPH_MIN_WIDTH, level = 0;
        while (w < width && level + 1 < RUNNER_GRAPH_WIDTHS) w *= 2, level++;
        width = w < r->table_cap ? w : r->table_cap;
        graph_key = bucket * RUNNER_GRAPH_WIDTHS + level;
    }
    const uint64_t step_bytes = step_tables(r, width, n_seqs);
    char *mirror = step_mirror(r);
    for (int32_t g = 0; g < r->layout.n_kv_groups; g++) {
        int32_t *h_table = (int32_t *)(mirror + r->off_table[g]), *h_slots = (int32_t *)(mirror + r->off_slots[g]);
        st = kv_batch_tables(r->kv, g, r->spans, n_real, width, h_table, h_slots);
        if (st) return st;
        for (int64_t j = (int64_t)n_real * width; j < (int64_t)n_seqs * width; j++) h_table[j] = -1;
        for (int32_t t = tok_real; t < tok; t++) h_slots[t] = -1;
        berth_tensor bt = tensor_2d(r->meta, r->off_table[g], BERTH_DTYPE_I32, width, n_seqs);
        berth_tensor sl = tensor_1d(r->meta, r->off_slots[g], BERTH_DTYPE_I32, tok);
        kv_group_batch(r->kv, g, &bt, &sl, &r->gb[g]);
    }
    if ((st = send_step(r, step_bytes))) return st;
    /* Fed rows: the sampled ids still on the device, in stream order after the upload above (runs of consecutive
     * rows in one copy; a steady decode batch is one run). */
    for (int32_t i = 0; i < n_real && n_fed > 0;) {
        if (steps[i].ids) {
            i++;
            continue;
        }
        int32_t j = i + 1;
        while (j < n_real && !steps[j].ids && steps[j].feed_row == steps[j - 1].feed_row + 1) j++;
        st = r->be->vt->buffer_copy(r->be->be, r->stream, r->meta, r->off_tokens + (uint64_t)r->h_q_start[i] * 4,
                                    r->meta, r->off_ids + (uint64_t)steps[i].feed_row * 4, (uint64_t)(j - i) * 4);
        if (st) return fail_with_backend(st, "cannot feed the sampled tokens");
        i = j;
    }

    berth_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_tokens = tok;
    b.n_seqs = n_seqs;
    b.n_logits = n_logits;
    b.max_q_len = max_q;
    b.max_kv_len = max_kv;
    b.tokens = tensor_1d(r->meta, r->off_tokens, BERTH_DTYPE_I32, tok);
    b.positions = tensor_1d(r->meta, r->off_positions, BERTH_DTYPE_I32, tok);
    b.seq_q_start = tensor_1d(r->meta, r->off_q_start, BERTH_DTYPE_I32, n_seqs + 1);
    b.seq_kv_len = tensor_1d(r->meta, r->off_kv_len, BERTH_DTYPE_I32, n_seqs);
    b.logit_rows = tensor_1d(r->meta, r->off_logit_rows, BERTH_DTYPE_I32, n_logits);
    if (r->layout.n_states > 0) {
        b.state_slots = tensor_1d(r->meta, r->off_state_slots, BERTH_DTYPE_I32, n_seqs);
        b.h_state_slots = r->h_state_slots;
    }
    b.h_tokens = n_fed > 0 ? NULL : r->h_tokens;
    b.h_positions = r->h_positions;
    b.h_seq_q_start = r->h_q_start;
    b.h_seq_kv_len = r->h_kv_len;
    b.h_logit_rows = r->h_logit_rows;
    b.n_kv_groups = r->layout.n_kv_groups;
    b.n_states = r->layout.n_states > 0 ? r->layout.n_states : 0;
    b.kv = r->gb;
    b.states = r->sb;
    b.logits = tensor_2d(r->logits, 0, BERTH_DTYPE_F32, r->info.vocab_size, n_logits);

    st = run_forward(r, &b, bucket, graph_key);
    if (st) {
        if (!berth_last_error()[0]) berth_fail(st, "model forward failed: %s", berth_status_str(st));
        return st;
    }
    n_seqs = n_real;
    n_logits = n_real_logits;
    int n_dec = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        if (steps[i].is_decode)
            r->stats.decode_steps++, n_dec++;
        else
            r->stats.prefill_tokens += steps[i].n;
        /* The step's K/V are written (in stream order): its full blocks may now serve later prefixes. A fed
         * row's id is not known yet: the caller publishes it (runner_seq_publish) once collected. */
        if (!steps[i].ids) continue;
        st = kv_seq_publish(r->kv, steps[i].seq, r->spans[i].start, steps[i].ids, steps[i].n);
        if (st) return st;
    }
    if (n_dec > 0 && n_dec < n_seqs) r->stats.mixed_steps++;
    r->n_logits = n_logits;
    return BERTH_OK;
}

berth_status runner_logits(struct runner *r, int32_t first, int32_t n_rows, float *dst)
{
    if (first < 0 || n_rows < 0 || first + n_rows > r->n_logits)
        return berth_fail(BERTH_E_INVALID, "logit rows %d..%d requested, the last step made %d", (int)first,
                          (int)(first + n_rows - 1), (int)r->n_logits);
    if (n_rows == 0) return BERTH_OK;
    uint64_t row = (uint64_t)r->info.vocab_size * sizeof(float);
    berth_status st = r->be->vt->buffer_download(r->be->be, r->stream, r->logits, (uint64_t)first * row, dst,
                                                 (uint64_t)n_rows * row);
    if (st) return fail_with_backend(st, "cannot download logits");
    st = sync_stream(r);
    return st ? fail_with_backend(st, "stream sync") : BERTH_OK;
}

berth_status runner_prefill(struct runner *r, int32_t seq, const int32_t *ids, int32_t n, int want_all_logits,
                            float *logits_out)
{
    double t0 = now_seconds();
    int32_t chunk = want_all_logits ? r->logits_rows_max : r->max_tokens;
    uint64_t vocab = (uint64_t)r->info.vocab_size;
    berth_status st = BERTH_OK;
    for (int32_t done = 0; done < n && !st; done += chunk) {
        int32_t m = n - done < chunk ? n - done : chunk;
        int last = done + m == n;
        struct runner_seq_step s = {seq, ids + done, m,
                                    want_all_logits ? RUNNER_LOGITS_ALL : last ? RUNNER_LOGITS_LAST : RUNNER_LOGITS_NONE,
                                    0, 0};
        st = runner_step(r, &s, 1);
        if (st) break;
        if (logits_out && want_all_logits)
            st = runner_logits(r, 0, m, logits_out + (uint64_t)done * vocab);
        else if (logits_out && last)
            st = runner_logits(r, 0, 1, logits_out);
    }
    if (!st && !logits_out) {
        st = sync_stream(r);
        if (st) st = fail_with_backend(st, "stream sync");
    }
    r->stats.prefill_seconds += now_seconds() - t0;
    return st;
}

berth_status runner_decode(struct runner *r, int32_t seq, int32_t token, float *logits_out)
{
    double t0 = now_seconds();
    struct runner_seq_step s = {seq, &token, 1, RUNNER_LOGITS_LAST, 1, 0};
    berth_status st = runner_step(r, &s, 1);
    if (!st && logits_out) st = runner_logits(r, 0, 1, logits_out);
    r->stats.decode_seconds += now_seconds() - t0;
    return st;
}

/* Greedy pick on the host, for backends without a sample op: argmax, ties to the lower id. */
static berth_status host_argmax(struct runner *r, int32_t row, int32_t *id)
{
    float *buf = malloc((size_t)r->info.vocab_size * sizeof *buf);
    if (!buf) return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    berth_status st = runner_logits(r, row, 1, buf);
    if (!st) {
        int32_t best = 0;
        for (int32_t v = 1; v < r->info.vocab_size; v++)
            if (buf[v] > buf[best]) best = v;
        *id = best;
    }
    free(buf);
    return st;
}

berth_status runner_sample_rows(struct runner *r, int32_t first, int32_t n_rows, const struct runner_sampling *sp,
                                const uint64_t *counters, int32_t *ids)
{
    return runner_sample_rows_lp(r, first, n_rows, sp, counters, ids, NULL);
}

int runner_sampling_uses_penalties(const struct runner_sampling *sp)
{
    float rep = sp->repetition_penalty == 0.0f ? 1.0f : sp->repetition_penalty;
    return rep != 1.0f || sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
}

/* Per-row parameters the sample op would refuse or that cannot mean anything, with the row named. */
static berth_status check_sampling(const struct runner_sampling *sp, int32_t row)
{
    if (sp->n_top < 0 || sp->n_top > RUNNER_MAX_TOP_LOGPROBS)
        return berth_fail(BERTH_E_INVALID, "row %d: top logprobs = %d must be in 0..%d", (int)row, (int)sp->n_top,
                          RUNNER_MAX_TOP_LOGPROBS);
    if (sp->repetition_penalty < 0.0f || sp->repetition_penalty != sp->repetition_penalty)
        return berth_fail(BERTH_E_INVALID, "row %d: repetition penalty = %g must be > 0", (int)row,
                          (double)sp->repetition_penalty);
    if (sp->n_history < 0 || (sp->n_history > 0 && !sp->history))
        return berth_fail(BERTH_E_INVALID, "row %d: bad penalty history (%d ids)", (int)row, (int)sp->n_history);
    if (sp->n_history_prompt < 0 || sp->n_history_prompt > sp->n_history)
        return berth_fail(BERTH_E_INVALID, "row %d: penalty history prompt length %d must be in 0..%d", (int)row,
                          (int)sp->n_history_prompt, (int)sp->n_history);
    return BERTH_OK;
}

berth_status runner_sample_rows_lp(struct runner *r, int32_t first, int32_t n_rows, const struct runner_sampling *sp,
                                   const uint64_t *counters, int32_t *ids, struct runner_sample_out *out)
{
    berth_status st = runner_sample_launch(r, RUNNER_SLOT_NOW, first, n_rows, sp, counters, out != NULL);
    return st ? st : runner_sample_collect(r, RUNNER_SLOT_NOW, ids, out);
}

/* Bytes of the sampled-output section of meta (off_ids .. end of off_top_lp): what a slot's mirror holds. */
static uint64_t out_section_bytes(const struct runner *r)
{
    return r->off_top_lp + (uint64_t)r->max_seqs * RUNNER_MAX_TOP_LOGPROBS * 4 - r->off_ids;
}

/* Sampled outputs' slots (struct runner): pinned mirrors + events on an asynchronous backend that has both, else
 * host arrays filled by synchronous downloads. Overlap needs the former on an asynchronous backend. */
static berth_status alloc_out_slots(struct runner *r)
{
    const berth_backend_vtable *vt = r->be->vt;
    const int async = r->be->device && (r->be->device->caps & BERTH_CAP_ASYNC);
    const int have_events = BERTH_HAS(vt, berth_backend_vtable, event_sync) && vt->event_create &&
                            vt->event_destroy && vt->event_record && vt->event_sync;
    r->async_out = async && have_events && vt->buffer_host_ptr;
    for (int k = 0; k < RUNNER_SAMPLE_SLOTS && r->async_out; k++) {
        struct out_slot *o = &r->out[k];
        void *p = NULL;
        if (vt->buffer_alloc(r->be->be, out_section_bytes(r), BERTH_USAGE_STAGING, &o->stage) != BERTH_OK)
            o->stage = NULL;
        if (!o->stage || vt->buffer_host_ptr(r->be->be, o->stage, &p) != BERTH_OK || !p ||
            vt->event_create(r->be->be, &o->ev) != BERTH_OK)
            r->async_out = 0;
        o->ptr = p;
    }
    if (!r->async_out) {
        berth_clear_error();
        for (int k = 0; k < RUNNER_SAMPLE_SLOTS; k++) {
            struct out_slot *o = &r->out[k];
            if (o->stage) vt->buffer_free(r->be->be, o->stage);
            if (o->ev) vt->event_destroy(r->be->be, o->ev);
            o->stage = NULL, o->ev = NULL, o->ptr = NULL;
        }
    }
    size_t S = (size_t)r->max_seqs;
    for (int k = 0; k < RUNNER_SAMPLE_SLOTS; k++)
        if (!(r->out[k].row_ntop = malloc(S * sizeof *r->out[k].row_ntop)))
            return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    for (int k = 0; k < RUNNER_SAMPLE_SLOTS && !r->async_out; k++) {
        struct out_slot *o = &r->out[k];
        o->ids = malloc(S * sizeof *o->ids);
        o->lp = malloc(S * sizeof *o->lp);
        o->top_ids = malloc(S * RUNNER_MAX_TOP_LOGPROBS * sizeof *o->top_ids);
        o->top_lp = malloc(S * RUNNER_MAX_TOP_LOGPROBS * sizeof *o->top_lp);
        if (!o->ids || !o->lp || !o->top_ids || !o->top_lp) return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    }
    /* Feeding sampled ids back on the device: the model must take a batch without h_tokens, and on an asynchronous
     * backend the outputs must arrive without a stream sync (else nothing overlaps: off unless asked for). */
    const berth_ops *ops = r->be->ops;
    int can = BERTH_HAS(&r->info, berth_model_info, h_tokens_optional) && r->info.h_tokens_optional && ops &&
              BERTH_HAS(ops, berth_ops, sample) && ops->sample;
    if (r->cfg.overlap < 0) can = 0;
    if (r->cfg.overlap == 0 && !(async && r->async_out)) can = 0; /* auto: only where it overlaps something */
    if (async && !r->async_out) can = 0;
    r->feed = can;
    return BERTH_OK;
}

static void free_out_slots(struct runner *r)
{
    const berth_backend_vtable *vt = r->be->vt;
    for (int k = 0; k < RUNNER_SAMPLE_SLOTS; k++) {
        struct out_slot *o = &r->out[k];
        if (o->stage) vt->buffer_free(r->be->be, o->stage);
        if (o->ev) vt->event_destroy(r->be->be, o->ev);
        free(o->ids), free(o->lp), free(o->top_ids), free(o->top_lp), free(o->row_ntop);
        memset(o, 0, sizeof *o);
    }
}

int runner_can_feed(const struct runner *r) { return r->feed; }

berth_status runner_seq_publish(struct runner *r, int32_t seq, int32_t start, const int32_t *ids, int32_t n)
{
    return kv_seq_publish(r->kv, seq, start, ids, n);
}

berth_status runner_sample_launch(struct runner *r, int slot, int32_t first, int32_t n_rows,
                                  const struct runner_sampling *sp, const uint64_t *counters, int want_lp)
{
    if (slot < 0 || slot >= RUNNER_SAMPLE_SLOTS)
        return berth_fail(BERTH_E_INVALID, "runner: sample slot %d is not in 0..%d", slot, RUNNER_SAMPLE_SLOTS - 1);
    struct out_slot *o = &r->out[slot];
    o->launched = 0;
    if (first < 0 || n_rows < 1 || first + n_rows > r->n_logits || n_rows > r->max_seqs)
        return berth_fail(BERTH_E_INVALID, "cannot sample rows %d..%d: the last step made %d logit rows", (int)first,
                          (int)(first + n_rows - 1), (int)r->n_logits);
    int32_t n_top = 0;
    int64_t n_hist = 0;
    for (int32_t i = 0; i < n_rows; i++) {
        berth_status st = check_sampling(&sp[i], i);
        if (st) return st;
        if (want_lp && sp[i].n_top > n_top) n_top = sp[i].n_top;
        if (runner_sampling_uses_penalties(&sp[i])) n_hist += sp[i].n_history;
        o->row_ntop[i] = sp[i].n_top;
    }
    if (n_top > r->info.vocab_size) n_top = r->info.vocab_size;
    o->n_rows = n_rows;
    o->n_top = n_top;
    o->want_lp = want_lp;
    o->serial = r->serial;
    const berth_ops *ops = r->be->ops;
    int have_sample = ops && BERTH_HAS(ops, berth_ops, sample) && ops->sample;
    if (!have_sample) {
        /* Greedy on the host (synchronous); the ids go in the slot's host arrays (never async_out: no sample op,
         * no overlap, but the mirrors may exist — read them from ids_host below). */
        for (int32_t i = 0; i < n_rows; i++) {
            const char *dev = r->be->device ? r->be->device->name : "?";
            if (sp[i].temperature > 0)
                return berth_fail(BERTH_E_UNSUPPORTED, "backend '%s' has no sample op: only --temperature 0 works",
                                  dev);
            if (runner_sampling_uses_penalties(&sp[i]) || want_lp)
                return berth_fail(BERTH_E_UNSUPPORTED, "backend '%s' has no sample op: no penalties or logprobs",
                                  dev);
        }
        int32_t *dst = r->async_out ? (int32_t *)o->ptr : o->ids;
        for (int32_t i = 0; i < n_rows; i++) {
            berth_status st = host_argmax(r, first + i, &dst[i]);
            if (st) return st;
        }
        o->launched = 2; /* done, nothing to wait for */
        r->fed_rows = 0; /* nothing on the device to feed from */
        return BERTH_OK;
    }
    /* One call for every row: per-row parameters side by side, histories concatenated. */
    size_t n = (size_t)n_rows;
    float *fl = malloc(n * 6 * sizeof *fl);
    int32_t *top_k = malloc(n * sizeof *top_k), *hist_start = calloc(n + 1, sizeof *hist_start);
    int32_t *out_start = malloc(n * sizeof *out_start);
    int32_t *hist = malloc((size_t)(n_hist > 0 ? n_hist : 1) * sizeof *hist);
    uint64_t *seed = malloc(n * sizeof *seed);
    if (!fl || !top_k || !hist_start || !out_start || !hist || !seed) {
        free(fl), free(top_k), free(hist_start), free(out_start), free(hist), free(seed);
        return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    }
    float *temperature = fl, *top_p = fl + n, *min_p = fl + 2 * n, *rep = fl + 3 * n, *presence = fl + 4 * n,
          *frequency = fl + 5 * n;
    int32_t h = 0;
    for (size_t i = 0; i < n; i++) {
        temperature[i] = sp[i].temperature;
        top_p[i] = sp[i].top_p;
        min_p[i] = sp[i].min_p;
        rep[i] = sp[i].repetition_penalty == 0.0f ? 1.0f : sp[i].repetition_penalty;
        presence[i] = sp[i].presence_penalty;
        frequency[i] = sp[i].frequency_penalty;
        top_k[i] = sp[i].top_k;
        seed[i] = sp[i].seed;
        hist_start[i] = h;
        out_start[i] = h; /* where the row's generated ids begin: presence/frequency count from there */
        if (runner_sampling_uses_penalties(&sp[i]) && sp[i].n_history > 0) {
            memcpy(hist + h, sp[i].history, (size_t)sp[i].n_history * sizeof *hist);
            out_start[i] = h + sp[i].n_history_prompt;
            h += sp[i].n_history;
        }
    }
    hist_start[n] = h;
    berth_sample_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.n_rows = n_rows;
    p.n_top = n_top;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.repetition_penalty = rep;
    p.presence_penalty = presence;
    p.frequency_penalty = frequency;
    p.seed = seed;
    p.counter = counters;
    p.history = h > 0 ? hist : NULL;
    p.history_start = hist_start;
    p.history_output_start = out_start;
    uint64_t row_bytes = (uint64_t)r->info.vocab_size * sizeof(float);
    p.logits = tensor_2d(r->logits, (uint64_t)first * row_bytes, BERTH_DTYPE_F32, r->info.vocab_size, n_rows);
    p.ids = tensor_1d(r->meta, r->off_ids, BERTH_DTYPE_I32, n_rows);
    if (want_lp) p.logprob = tensor_1d(r->meta, r->off_lp, BERTH_DTYPE_F32, n_rows);
    if (n_top > 0) {
        p.top_ids = tensor_2d(r->meta, r->off_top_ids, BERTH_DTYPE_I32, n_top, n_rows);
        p.top_logprobs = tensor_2d(r->meta, r->off_top_lp, BERTH_DTYPE_F32, n_top, n_rows);
    }
    const berth_backend_vtable *vt = r->be->vt;
    berth_status st = ops->sample(r->be->be, r->stream, &p);
    free(fl), free(top_k), free(hist_start), free(out_start), free(hist), free(seed); /* read before returning */
    if (st) return fail_with_backend(st, "sampling failed");
    r->fed_rows = n_rows;
    /* The outputs to the slot: into its pinned mirror (same offsets as meta, less off_ids) with asynchronous copies
     * and an event after them, or downloaded now. */
    struct {
        uint64_t off;
        void *host;
        uint64_t bytes;
    } part[4] = {{r->off_ids, o->ids, n * 4},
                 {r->off_lp, o->lp, want_lp ? n * 4 : 0},
                 {r->off_top_ids, o->top_ids, n * (uint64_t)n_top * 4},
                 {r->off_top_lp, o->top_lp, n * (uint64_t)n_top * 4}};
    for (int k = 0; k < 4 && !st; k++) {
        if (!part[k].bytes) continue;
        if (r->async_out)
            st = vt->buffer_copy(r->be->be, r->stream, o->stage, part[k].off - r->off_ids, r->meta, part[k].off,
                                 part[k].bytes);
        else
            st = vt->buffer_download(r->be->be, r->stream, r->meta, part[k].off, part[k].host, part[k].bytes);
    }
    if (!st) st = r->async_out ? vt->event_record(r->be->be, r->stream, o->ev) : sync_stream(r);
    if (st) return fail_with_backend(st, "cannot read the sampled tokens");
    o->launched = 1;
    return BERTH_OK;
}

berth_status runner_sample_collect(struct runner *r, int slot, int32_t *ids, struct runner_sample_out *out)
{
    if (slot < 0 || slot >= RUNNER_SAMPLE_SLOTS || !r->out[slot].launched)
        return berth_fail(BERTH_E_INVALID, "runner: sample slot %d holds no launched sample", slot);
    struct out_slot *o = &r->out[slot];
    const int32_t *rid = o->ids;
    const float *rlp = o->lp;
    const int32_t *rtid = o->top_ids;
    const float *rtlp = o->top_lp;
    if (r->async_out) {
        if (o->launched == 1) {
            berth_status st = r->be->vt->event_sync(r->be->be, o->ev);
            if (st) return fail_with_backend(st, "cannot read the sampled tokens");
            if (o->serial > r->done_serial) r->done_serial = o->serial;
        }
        rid = (const int32_t *)o->ptr;
        rlp = (const float *)(o->ptr + (r->off_lp - r->off_ids));
        rtid = (const int32_t *)(o->ptr + (r->off_top_ids - r->off_ids));
        rtlp = (const float *)(o->ptr + (r->off_top_lp - r->off_ids));
    }
    o->launched = 0;
    const size_t n = (size_t)o->n_rows, n_top = (size_t)o->n_top;
    for (size_t i = 0; i < n; i++)
        if (rid[i] < 0 || rid[i] >= r->info.vocab_size)
            return berth_fail(BERTH_E_BACKEND, "the backend's sample op returned token %d, outside the vocabulary "
                              "(size %d)", (int)rid[i], (int)r->info.vocab_size);
    memcpy(ids, rid, n * sizeof *ids);
    for (size_t i = 0; out && o->want_lp && i < n; i++) {
        out[i].logprob = rlp[i];
        out[i].n_top = (size_t)o->row_ntop[i] < n_top ? o->row_ntop[i] : (int32_t)n_top;
        for (size_t k = 0; k < (size_t)out[i].n_top; k++) {
            out[i].top_ids[k] = rtid[i * n_top + k];
            out[i].top_logprobs[k] = rtlp[i * n_top + k];
        }
    }
    return BERTH_OK;
}

berth_status runner_sample_row(struct runner *r, int32_t row, const struct runner_sampling *sp, uint64_t counter,
                               int32_t *id)
{
    if (row < 0 || row >= r->n_logits)
        return berth_fail(BERTH_E_INVALID, "cannot sample row %d: the last step made %d logit rows", (int)row,
                          (int)r->n_logits);
    return runner_sample_rows(r, row, 1, sp, &counter, id);
}

static int is_eos(const berth_model_info *info, int32_t tok)
{
    for (int32_t i = 0; i < info->n_eos; i++)
        if (info->eos_ids[i] == tok) return 1;
    return 0;
}

berth_status runner_generate(struct runner *r, const int32_t *prompt, int32_t n, const struct runner_gen_params *gp,
                             float *prompt_logits, runner_token_fn cb, void *arg, struct runner_generation *out)
{
    memset(out, 0, sizeof *out);
    const int32_t max_new = gp->max_new;
    const struct runner_sampling *sp = &gp->sampling;
    berth_status st = runner_check_prompt(&r->info, r->cfg.model_dir, prompt, n, max_new);
    if (st) return st;
    /* all = prompt then generated: the penalty history. */
    int32_t *all = malloc((size_t)(n + (max_new > 0 ? max_new : 1)) * sizeof *all);
    struct runner_sample_out *lps = gp->logprobs ? calloc((size_t)(max_new > 0 ? max_new : 1), sizeof *lps) : NULL;
    if (!all || (gp->logprobs && !lps)) {
        free(all), free(lps);
        return berth_fail(BERTH_E_NOMEM, "runner: out of host memory");
    }
    memcpy(all, prompt, (size_t)n * sizeof *all);
    int32_t *toks = all + n;
    struct runner_sampling row_sp = *sp;
    int with_prompt = sp->repetition_penalty != 0.0f && sp->repetition_penalty != 1.0f;
    row_sp.history = with_prompt ? all : toks;
    row_sp.n_history_prompt = with_prompt ? n : 0; /* presence/frequency count the generated ids only */
    if (!gp->logprobs) row_sp.n_top = 0;
    int32_t seq = -1;
    st = runner_seq_new(r, &seq);
    if (st) {
        free(all), free(lps);
        return st;
    }
    const char *finish = RUNNER_FINISH_LENGTH;
    int32_t count = 0;
    int32_t cached = 0;
    if (!prompt_logits) st = runner_seq_attach_prefix(r, seq, prompt, n, &cached);
    if (!st) st = runner_prefill(r, seq, prompt + cached, n - cached, prompt_logits != NULL, prompt_logits);
    int32_t row = r->n_logits - 1;
    for (int32_t i = 0; !st && i < max_new; i++) {
        int32_t tok;
        uint64_t ctr = (uint64_t)(n + i);
        row_sp.n_history = with_prompt ? n + count : count;
        st = runner_sample_rows_lp(r, row, 1, &row_sp, &ctr, &tok, lps ? &lps[count] : NULL);
        if (st) break;
        toks[count++] = tok;
        int stop = !gp->ignore_eos && is_eos(&r->info, tok);
        if (cb && cb(tok, arg)) stop = 1;
        if (stop) {
            finish = RUNNER_FINISH_STOP;
            break;
        }
        if (i + 1 < max_new) {
            st = runner_decode(r, seq, tok, NULL);
            row = 0;
        }
    }
    runner_seq_free(r, seq);
    if (st) {
        free(all), free(lps);
        return st;
    }
    memmove(all, toks, (size_t)count * sizeof *all);
    out->tokens = all;
    out->logprobs = lps;
    out->n_tokens = count;
    out->finish_reason = finish;
    out->cached_tokens = cached;
    return BERTH_OK;
}

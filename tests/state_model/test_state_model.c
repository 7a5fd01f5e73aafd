/*
 * test_state_model.c — a model plugin with one recurrent state, for testing the host's per-sequence state slots
 * end to end (tests/test_engine_recurrent_state.c). Test scaffolding, not a model.
 *
 * Checkpoint: config.json with model_type "berth_state_test" (the only type accepted), vocab_size V (2..1024) and
 * optionally max_position_embeddings (default 256); the weights are never read.
 *
 * Memory: one f32 state "counts" of ne {V} per sequence, and one FULL KV group (1 layer, 1 head, head_dim 4) that
 * every step writes zeros into through kv_append, so the paged path runs beside the state.
 *
 * forward: for each sequence, for each of its new tokens in order, counts[slot] += onehot(token) (get_rows from an
 * identity table uploaded at load, then binary ADD into the slot's view), and each logits row receives the counts
 * of its sequence right after its token was added (copy). So a logits row is the exact multiset of tokens the
 * sequence has seen up to and including that row's token: a state that was not zeroed, was mixed with another
 * sequence's, was not copied on fork or not restored on a prefix hit shows in the logits.
 *
 * The slot ids come from the batch's host copy, h_state_slots (ABI 0.3); forward also downloads the device copy
 * (a sync per step: fine for a test model) and fails unless the two agree, so the test checks the host's copy too.
 *
 * Counters: "tokens" (tokens run through forward), "forward_calls".
 */
#include <berth/model.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SM_NAME "state_test"
#define SM_TYPE "berth_state_test"
#define SM_HEAD_DIM 4
#define SM_MAX_VOCAB 1024

struct berth_model {
    const berth_host *host;
    int32_t vocab;
    int32_t max_positions;
    /* requirements: get_rows, binary, copy, kv_append */
    berth_get_rows_params rq_get_rows;
    berth_binary_params rq_binary;
    berth_copy_params rq_copy;
    berth_kv_append_params rq_kv_append;
    berth_requirement reqs[4];
    const berth_requirement *req_ptrs[4];
    berth_kv_group_desc group;
    const berth_kv_group_desc *groups[1];
    berth_state_desc state;
    const berth_state_desc *states[1];
    /* after load */
    const berth_backend_api *be;
    int32_t max_tokens, max_seqs;
    berth_buffer *identity; /* V x V f32 */
    berth_buffer *onehot;   /* V x max_tokens f32 scratch */
    berth_buffer *zeros;    /* SM_HEAD_DIM x max_tokens f32, all zero: K and V of every token */
    int32_t *h_slots;       /* max_seqs */
    int64_t n_tokens_seen, n_forward;
};

static berth_status fail(const berth_host *host, berth_status code, const char *msg)
{
    host->set_error(host->ctx, code, msg);
    return code;
}

static void packed(berth_tensor *t, berth_buffer *buf, uint64_t offset, berth_dtype dt, int32_t ndim, int64_t n0,
                   int64_t n1, int64_t n2)
{
    memset(t, 0, sizeof *t);
    t->buf = buf;
    t->offset = offset;
    t->dtype = dt;
    t->ndim = ndim;
    t->ne[0] = n0;
    t->ne[1] = n1;
    t->ne[2] = n2;
    t->ne[3] = 1;
    t->nb[0] = 4; /* f32 and i32 only */
    for (int i = 1; i < 4; i++) t->nb[i] = t->nb[i - 1] * t->ne[i - 1];
}

static berth_status sm_accept(const berth_host *host, const berth_checkpoint *ck)
{
    const char *mt = NULL;
    if (host->ckpt_cfg_string(host->ctx, ck, "model_type", &mt) != BERTH_OK)
        return fail(host, BERTH_E_UNSUPPORTED, "config.json has no model_type");
    if (strcmp(mt, SM_TYPE) != 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "model_type '%.100s' is not " SM_TYPE, mt);
        return fail(host, BERTH_E_UNSUPPORTED, msg);
    }
    return BERTH_OK;
}

static void fill_requirements(berth_model *m)
{
    const int64_t V = m->vocab, T = 1;
    m->rq_get_rows.struct_size = sizeof m->rq_get_rows;
    m->rq_get_rows.scale = 1.0f;
    packed(&m->rq_get_rows.table, NULL, 0, BERTH_DTYPE_F32, 2, V, V, 1);
    packed(&m->rq_get_rows.ids, NULL, 0, BERTH_DTYPE_I32, 1, T, 1, 1);
    packed(&m->rq_get_rows.y, NULL, 0, BERTH_DTYPE_F32, 2, V, T, 1);
    m->rq_binary.struct_size = sizeof m->rq_binary;
    m->rq_binary.op = BERTH_BINARY_ADD;
    m->rq_binary.scale = 1.0f;
    packed(&m->rq_binary.a, NULL, 0, BERTH_DTYPE_F32, 1, V, 1, 1);
    m->rq_binary.b = m->rq_binary.y = m->rq_binary.a;
    m->rq_copy.struct_size = sizeof m->rq_copy;
    packed(&m->rq_copy.x, NULL, 0, BERTH_DTYPE_F32, 1, V, 1, 1);
    m->rq_copy.y = m->rq_copy.x;
    berth_kv_append_params *ka = &m->rq_kv_append;
    ka->struct_size = sizeof *ka;
    ka->k_norm_mode = ka->v_norm_mode = BERTH_NORM_W_NONE;
    packed(&ka->k, NULL, 0, BERTH_DTYPE_F32, 3, SM_HEAD_DIM, 1, T);
    ka->v = ka->k;
    packed(&ka->slots, NULL, 0, BERTH_DTYPE_I32, 1, T, 1, 1);
    ka->kv.dtype = BERTH_DTYPE_F32;
    ka->kv.block_size = 16;
    ka->kv.n_blocks = 1;
    ka->kv.n_kv_heads = 1;
    ka->kv.head_dim = ka->kv.head_dim_v = SM_HEAD_DIM;
    ka->kv.head_stride = ka->kv.v_head_stride = SM_HEAD_DIM * 4;
    ka->kv.token_stride = ka->kv.v_token_stride = SM_HEAD_DIM * 4;
    ka->kv.block_stride = 2ull * 16 * SM_HEAD_DIM * 4;
    m->reqs[0] = (berth_requirement){sizeof(berth_requirement), BERTH_OP_GET_ROWS, &m->rq_get_rows,
                                     "get_rows (f32 identity table: one-hot of each token)"};
    m->reqs[1] = (berth_requirement){sizeof(berth_requirement), BERTH_OP_BINARY, &m->rq_binary,
                                     "binary add (f32: state += one-hot)"};
    m->reqs[2] = (berth_requirement){sizeof(berth_requirement), BERTH_OP_COPY, &m->rq_copy,
                                     "copy (f32: state -> logits row)"};
    m->reqs[3] = (berth_requirement){sizeof(berth_requirement), BERTH_OP_KV_APPEND, &m->rq_kv_append,
                                     "kv_append (head_dim 4, no norm, no rope)"};
    for (int i = 0; i < 4; i++) m->req_ptrs[i] = &m->reqs[i];
}

static berth_status sm_create(const berth_host *host, const berth_checkpoint *ck, berth_model **out)
{
    *out = NULL;
    const char *dir = host->ckpt_dir(host->ctx, ck);
    char msg[512];
    int64_t vocab = 0, maxpos = 256;
    if (host->ckpt_cfg_int(host->ctx, ck, "vocab_size", &vocab) != BERTH_OK || vocab < 2 || vocab > SM_MAX_VOCAB) {
        snprintf(msg, sizeof msg, "%.400s/config.json: vocab_size must be an integer in 2..%d", dir ? dir : ".",
                 SM_MAX_VOCAB);
        return fail(host, BERTH_E_INVALID, msg);
    }
    if (host->ckpt_cfg_type(host->ctx, ck, "max_position_embeddings") != BERTH_JSON_MISSING &&
        (host->ckpt_cfg_int(host->ctx, ck, "max_position_embeddings", &maxpos) != BERTH_OK || maxpos < 1 ||
         maxpos > (1 << 20))) {
        snprintf(msg, sizeof msg, "%.400s/config.json: max_position_embeddings must be an integer in 1..%d",
                 dir ? dir : ".", 1 << 20);
        return fail(host, BERTH_E_INVALID, msg);
    }
    berth_model *m = calloc(1, sizeof *m);
    if (!m) return fail(host, BERTH_E_NOMEM, SM_NAME ": out of memory");
    m->host = host;
    m->vocab = (int32_t)vocab;
    m->max_positions = (int32_t)maxpos;
    fill_requirements(m);
    m->group = (berth_kv_group_desc){sizeof(berth_kv_group_desc), BERTH_KV_FULL, 0, 1, 1, SM_HEAD_DIM, SM_HEAD_DIM,
                                     "full"};
    m->groups[0] = &m->group;
    m->state.struct_size = sizeof m->state;
    m->state.dtype = BERTH_DTYPE_F32;
    m->state.ndim = 1;
    m->state.ne[0] = m->vocab;
    m->state.ne[1] = m->state.ne[2] = 1;
    snprintf(m->state.name, sizeof m->state.name, "counts");
    m->states[0] = &m->state;
    *out = m;
    return BERTH_OK;
}

static void sm_destroy(berth_model *m)
{
    if (!m) return;
    if (m->be) {
        if (m->identity) m->be->vt->buffer_free(m->be->be, m->identity);
        if (m->onehot) m->be->vt->buffer_free(m->be->be, m->onehot);
        if (m->zeros) m->be->vt->buffer_free(m->be->be, m->zeros);
    }
    free(m->h_slots);
    free(m);
}

static berth_status sm_info(const berth_model *m, berth_model_info *out)
{
    out->vocab_size = m->vocab;
    out->n_layers = 1;
    out->hidden_size = m->vocab;
    out->max_positions = m->max_positions;
    out->bos_id = -1;
    out->n_eos = 0;
    out->is_encoder_decoder = 0;
    out->decoder_start_id = -1;
    snprintf(out->arch, sizeof out->arch, "%s", SM_TYPE);
    return BERTH_OK;
}

static berth_status sm_memory_layout(const berth_model *m, berth_memory_layout *out)
{
    out->n_kv_groups = 1;
    out->kv_groups = m->groups;
    out->n_states = 1;
    out->states = m->states;
    return BERTH_OK;
}

static berth_status sm_requirements(const berth_model *m, const berth_requirement *const **out, int32_t *n)
{
    *out = m->req_ptrs;
    *n = 4;
    return BERTH_OK;
}

/* Keep the backend's message (set through the host already); add ours only when it left none. */
static berth_status be_fail(const berth_model *m, berth_status st, const char *what)
{
    char msg[160];
    snprintf(msg, sizeof msg, SM_NAME ": %s failed (status %d)", what, (int)st);
    m->host->log(m->host->ctx, BERTH_LOG_ERROR, msg);
    return st;
}

static berth_status sm_load(berth_model *m, const berth_backend_api *be, const berth_load_params *lp)
{
    if (m->be) return fail(m->host, BERTH_E_INVALID, SM_NAME ": load() called twice");
    if (!BERTH_HAS(lp, berth_load_params, stream) || !lp->stream)
        return fail(m->host, BERTH_E_ABI, SM_NAME ": the host passed no load stream (needs berth_load_params.stream)");
    if (lp->max_batch_tokens < 1 || lp->max_seqs < 1)
        return fail(m->host, BERTH_E_INVALID, SM_NAME ": max_batch_tokens and max_seqs must be at least 1");
    if (lp->kv_dtype != BERTH_DTYPE_F32)
        return fail(m->host, BERTH_E_UNSUPPORTED, SM_NAME ": only an f32 KV cache is supported");
    m->be = be;
    m->max_tokens = lp->max_batch_tokens;
    m->max_seqs = lp->max_seqs;
    const uint64_t V = (uint64_t)m->vocab;
    const berth_backend_vtable *vt = be->vt;
    m->h_slots = malloc((size_t)m->max_seqs * sizeof *m->h_slots);
    float *eye = calloc(V * V, sizeof *eye);
    if (!m->h_slots || !eye) {
        free(eye);
        return fail(m->host, BERTH_E_NOMEM, SM_NAME ": out of memory");
    }
    for (uint64_t i = 0; i < V; i++) eye[i * V + i] = 1.0f;
    berth_status st;
    if ((st = vt->buffer_alloc(be->be, V * V * 4, BERTH_USAGE_WEIGHTS, &m->identity)) ||
        (st = vt->buffer_alloc(be->be, V * (uint64_t)m->max_tokens * 4, BERTH_USAGE_ACTIVATIONS, &m->onehot)) ||
        (st = vt->buffer_alloc(be->be, SM_HEAD_DIM * (uint64_t)m->max_tokens * 4, BERTH_USAGE_ACTIVATIONS,
                               &m->zeros))) {
        free(eye);
        return be_fail(m, st, "buffer_alloc");
    }
    st = vt->buffer_upload(be->be, lp->stream, m->identity, 0, eye, V * V * 4);
    if (!st) st = vt->buffer_fill(be->be, lp->stream, m->zeros, 0, 0, SM_HEAD_DIM * (uint64_t)m->max_tokens * 4);
    if (!st) st = vt->stream_sync(be->be, lp->stream);
    free(eye);
    return st ? be_fail(m, st, "uploading the identity table") : BERTH_OK;
}

static berth_status sm_forward(berth_model *m, berth_stream *s, const berth_batch *b)
{
    if (!m->be) return fail(m->host, BERTH_E_INVALID, SM_NAME ": forward() before load()");
    const int32_t V = m->vocab, T = b->n_tokens;
    if (T < 1 || T > m->max_tokens || b->n_seqs < 1 || b->n_seqs > m->max_seqs)
        return fail(m->host, BERTH_E_INVALID, SM_NAME ": batch size outside what load() was given");
    if (b->n_states != 1 || !b->states || b->n_kv_groups != 1 || !b->kv || !b->state_slots.buf)
        return fail(m->host, BERTH_E_INVALID, SM_NAME ": the batch lacks the state pool, its slots or the KV group");
    const berth_tensor *pool = &b->states[0].pool;
    if (pool->dtype != BERTH_DTYPE_F32 || pool->ne[0] != V || pool->nb[0] != 4)
        return fail(m->host, BERTH_E_INVALID, SM_NAME ": the state pool is not f32 ne {vocab, n_slots}");
    const int64_t n_slots = pool->ne[1];
    const berth_backend_vtable *vt = m->be->vt;
    const berth_ops *ops = m->be->ops;
    berth_backend *be = m->be->be;

    berth_status st = vt->buffer_download(be, s, b->state_slots.buf, b->state_slots.offset, m->h_slots,
                                          (uint64_t)b->n_seqs * 4);
    if (!st) st = vt->stream_sync(be, s);
    if (st) return be_fail(m, st, "reading state_slots");
    if (!BERTH_HAS(b, berth_batch, h_state_slots) || !b->h_state_slots)
        return fail(m->host, BERTH_E_INVALID, SM_NAME ": the batch lacks h_state_slots (the host copy of state_slots)");
    for (int32_t i = 0; i < b->n_seqs; i++)
        if (b->h_state_slots[i] != m->h_slots[i]) {
            char msg[160];
            snprintf(msg, sizeof msg, SM_NAME ": h_state_slots[%d] = %d but the device copy holds %d", (int)i,
                     (int)b->h_state_slots[i], (int)m->h_slots[i]);
            return fail(m->host, BERTH_E_INVALID, msg);
        }
    for (int32_t i = 0; i < b->n_seqs; i++)
        if (m->h_slots[i] < 0 || m->h_slots[i] >= n_slots) {
            char msg[160];
            snprintf(msg, sizeof msg, SM_NAME ": state slot %d of sequence %d is outside the pool's %lld slots",
                     (int)m->h_slots[i], (int)i, (long long)n_slots);
            return fail(m->host, BERTH_E_INVALID, msg);
        }

    /* One-hot rows of every token at once. */
    berth_get_rows_params gr;
    memset(&gr, 0, sizeof gr);
    gr.struct_size = sizeof gr;
    gr.scale = 1.0f;
    packed(&gr.table, m->identity, 0, BERTH_DTYPE_F32, 2, V, V, 1);
    gr.ids = b->tokens;
    packed(&gr.y, m->onehot, 0, BERTH_DTYPE_F32, 2, V, T, 1);
    if ((st = ops->get_rows(be, s, &gr))) return be_fail(m, st, "get_rows");

    /* Zeros into the KV pages: the host's block tables and slots are used, the model never reads them back. */
    berth_kv_append_params ka;
    memset(&ka, 0, sizeof ka);
    ka.struct_size = sizeof ka;
    ka.k_norm_mode = ka.v_norm_mode = BERTH_NORM_W_NONE;
    packed(&ka.k, m->zeros, 0, BERTH_DTYPE_F32, 3, SM_HEAD_DIM, 1, T);
    ka.v = ka.k;
    ka.slots = b->kv[0].slots;
    ka.kv = b->kv[0].pool;
    if ((st = ops->kv_append(be, s, &ka))) return be_fail(m, st, "kv_append");

    int32_t row = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        berth_tensor state;
        packed(&state, pool->buf, pool->offset + (uint64_t)m->h_slots[i] * (uint64_t)pool->nb[1], BERTH_DTYPE_F32,
               1, V, 1, 1);
        for (int32_t t = b->h_seq_q_start[i]; t < b->h_seq_q_start[i + 1]; t++) {
            berth_binary_params add;
            memset(&add, 0, sizeof add);
            add.struct_size = sizeof add;
            add.op = BERTH_BINARY_ADD;
            add.scale = 1.0f;
            add.a = add.y = state;
            packed(&add.b, m->onehot, (uint64_t)t * (uint64_t)V * 4, BERTH_DTYPE_F32, 1, V, 1, 1);
            if ((st = ops->binary(be, s, &add))) return be_fail(m, st, "binary add");
            if (row < b->n_logits && b->h_logit_rows[row] == t) {
                berth_copy_params cp;
                memset(&cp, 0, sizeof cp);
                cp.struct_size = sizeof cp;
                cp.x = state;
                packed(&cp.y, b->logits.buf, b->logits.offset + (uint64_t)row * (uint64_t)b->logits.nb[1],
                       BERTH_DTYPE_F32, 1, V, 1, 1);
                if ((st = ops->copy(be, s, &cp))) return be_fail(m, st, "copy");
                row++;
            }
        }
    }
    if (row != b->n_logits)
        return fail(m->host, BERTH_E_INVALID, SM_NAME ": logit_rows are not ascending token indices of the batch");
    m->n_tokens_seen += T;
    m->n_forward++;
    return BERTH_OK;
}

static berth_status sm_counters(const berth_model *m, berth_counter *out, int32_t cap, int32_t *n)
{
    const berth_counter c[2] = {{"tokens", m->n_tokens_seen}, {"forward_calls", m->n_forward}};
    *n = 2;
    for (int32_t i = 0; i < 2 && i < cap; i++) out[i] = c[i];
    return BERTH_OK;
}

static const char *const sm_types[] = {SM_TYPE, NULL};

static const berth_model_vtable sm_vtable = {
    .struct_size = sizeof(berth_model_vtable),
    .model_types = sm_types,
    .accept = sm_accept,
    .create = sm_create,
    .destroy = sm_destroy,
    .info = sm_info,
    .memory_layout = sm_memory_layout,
    .requirements = sm_requirements,
    .load = sm_load,
    .forward = sm_forward,
    .counters = sm_counters,
};

static const berth_plugin_desc sm_desc = {
    .magic = BERTH_PLUGIN_MAGIC,
    .struct_size = BERTH_SIZE_TO(berth_plugin_desc, vtable),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .kind = BERTH_PLUGIN_MODEL,
    .name = SM_NAME,
    .version = "0.1.0",
    .description = "recurrent-state test model (logits = counts of the tokens seen)",
    .required_services = BERTH_SVC_LOG | BERTH_SVC_CHECKPOINT,
    .vtable = &sm_vtable,
};

BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor);
const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor)
{
    (void)major;
    (void)minor;
    return &sm_desc;
}

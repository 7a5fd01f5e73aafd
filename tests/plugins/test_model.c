/*
 * test_model.c — a small model plugin for the selection tests.
 *
 * It handles config.json model_type TM_TYPE and requires two ops: matmul (f32 weights) and attention with the
 * head_dim from its [model.NAME] head_dim key (default 64), so tests can ask for an op a backend lacks or a
 * parameter its supports() refuses. Its bad_requirement key ("null" or "small") makes the second entry of its
 * requirement list a NULL pointer or a struct too small to read, to test that the host refuses a malformed list
 * without crashing. It never runs: load() and forward() fail with BERTH_E_UNSUPPORTED and say so.
 * Test scaffolding, not a model.
 *
 * Switches: TM_NAME, TM_TYPE, TM_NULL_FORWARD.
 */
#include <berth/model.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TM_NAME
#define TM_NAME "testmodel"
#endif
#ifndef TM_TYPE
#define TM_TYPE "berth_test"
#endif

struct berth_model {
    const berth_host *host;
    berth_matmul_params matmul;
    berth_attention_params attention;
    char attention_what[64];
    berth_requirement reqs[2];
    const berth_requirement *req_ptrs[2]; /* requirements() hands out pointers (ABI 0.2) */
    berth_kv_group_desc group;
    const berth_kv_group_desc *groups[1];
};

static berth_status fail(const berth_host *host, berth_status code, const char *msg)
{
    host->set_error(host->ctx, code, msg);
    return code;
}

static berth_status tm_accept(const berth_host *host, const berth_checkpoint *ck)
{
    const char *mt = NULL;
    if (host->ckpt_cfg_string(host->ctx, ck, "model_type", &mt) != BERTH_OK)
        return fail(host, BERTH_E_UNSUPPORTED, "config.json has no model_type");
    if (strcmp(mt, TM_TYPE) != 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "model_type '%.100s' is not " TM_TYPE, mt);
        return fail(host, BERTH_E_UNSUPPORTED, msg);
    }
    return BERTH_OK;
}

static void tm_tensor(berth_tensor *t, berth_dtype dt, int64_t n0, int64_t n1, int64_t n2)
{
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = 3;
    t->ne[0] = n0;
    t->ne[1] = n1;
    t->ne[2] = n2;
    t->ne[3] = 1;
    t->nb[0] = 4;
    t->nb[1] = 4 * n0;
    t->nb[2] = 4 * n0 * n1;
    t->nb[3] = t->nb[2] * n2;
}

static berth_status tm_create(const berth_host *host, const berth_checkpoint *ck, berth_model **out)
{
    long head_dim = 64;
    const char *v = host->config_get(host->ctx, "head_dim");
    if (v) {
        char *end;
        head_dim = strtol(v, &end, 10);
        if (*end || head_dim <= 0 || head_dim > 4096)
            return fail(host, BERTH_E_INVALID, "[model." TM_NAME "] head_dim: not a positive integer");
    }
    berth_model *m = calloc(1, sizeof *m);
    if (!m)
        return fail(host, BERTH_E_NOMEM, TM_NAME ": out of memory");
    m->host = host;
    m->matmul.struct_size = sizeof m->matmul;
    tm_tensor(&m->matmul.x, BERTH_DTYPE_F32, 128, 1, 1);
    tm_tensor(&m->matmul.w, BERTH_DTYPE_F32, 128, 128, 1);
    tm_tensor(&m->matmul.y, BERTH_DTYPE_F32, 128, 1, 1);
    m->attention.struct_size = sizeof m->attention;
    m->attention.mask = BERTH_MASK_CAUSAL;
    m->attention.scale = 1.0f;
    tm_tensor(&m->attention.q, BERTH_DTYPE_F32, head_dim, 2, 1);
    tm_tensor(&m->attention.out, BERTH_DTYPE_F32, head_dim, 2, 1);
    snprintf(m->attention_what, sizeof m->attention_what, "attention (head_dim %ld, window 0)", head_dim);
    m->reqs[0] = (berth_requirement){sizeof(berth_requirement), BERTH_OP_MATMUL, &m->matmul, "matmul (f32 weights)"};
    m->reqs[1] = (berth_requirement){sizeof(berth_requirement), BERTH_OP_ATTENTION, &m->attention, m->attention_what};
    m->req_ptrs[0] = &m->reqs[0];
    m->req_ptrs[1] = &m->reqs[1];
    const char *bad = host->config_get(host->ctx, "bad_requirement");
    if (bad && strcmp(bad, "null") == 0)
        m->req_ptrs[1] = NULL;
    else if (bad && strcmp(bad, "small") == 0)
        m->reqs[1].struct_size = 8; /* covers struct_size and op, not params */
    m->group = (berth_kv_group_desc){sizeof(berth_kv_group_desc), BERTH_KV_FULL, 0, 1, 2, (int32_t)head_dim,
                                     (int32_t)head_dim, "full"};
    m->groups[0] = &m->group;
    *out = m;
    return BERTH_OK;
}

static void tm_destroy(berth_model *m) { free(m); }

static berth_status tm_info(const berth_model *m, berth_model_info *out)
{
    out->vocab_size = 16;
    out->n_layers = 1;
    out->hidden_size = 128;
    out->max_positions = 64;
    out->bos_id = -1;
    out->n_eos = 0;
    out->is_encoder_decoder = 0;
    out->decoder_start_id = -1;
    snprintf(out->arch, sizeof out->arch, "%s", TM_TYPE);
    return BERTH_OK;
}

static berth_status tm_memory_layout(const berth_model *m, berth_memory_layout *out)
{
    out->n_kv_groups = 1;
    out->kv_groups = m->groups;
    out->n_states = 0;
    out->states = NULL;
    return BERTH_OK;
}

static berth_status tm_requirements(const berth_model *m, const berth_requirement *const **out, int32_t *n)
{
    *out = m->req_ptrs;
    *n = 2;
    return BERTH_OK;
}

static berth_status tm_load(berth_model *m, const berth_backend_api *be, const berth_load_params *lp)
{
    return fail(m->host, BERTH_E_UNSUPPORTED, TM_NAME ": the test model does not run");
}

__attribute__((unused)) static berth_status tm_forward(berth_model *m, berth_stream *s, const berth_batch *b)
{
    return fail(m->host, BERTH_E_UNSUPPORTED, TM_NAME ": the test model does not run");
}

static const char *const tm_types[] = {TM_TYPE, NULL};

static const berth_model_vtable tm_vtable = {
    .struct_size = sizeof(berth_model_vtable),
    .model_types = tm_types,
    .accept = tm_accept,
    .create = tm_create,
    .destroy = tm_destroy,
    .info = tm_info,
    .memory_layout = tm_memory_layout,
    .requirements = tm_requirements,
    .load = tm_load,
#ifdef TM_NULL_FORWARD
    .forward = NULL,
#else
    .forward = tm_forward,
#endif
};

static const berth_plugin_desc tm_desc = {
    .magic = BERTH_PLUGIN_MAGIC,
    .struct_size = BERTH_SIZE_TO(berth_plugin_desc, vtable),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .kind = BERTH_PLUGIN_MODEL,
    .name = TM_NAME,
    .version = "0.1.0",
    .description = "test model (" TM_NAME ")",
    .required_services = BERTH_SVC_LOG | BERTH_SVC_CONFIG | BERTH_SVC_CHECKPOINT,
    .vtable = &tm_vtable,
};

BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor);
const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor) { return &tm_desc; }

/*
 * gemma4.c — the Gemma 4 model plugin: descriptor and model vtable (model.h).
 *
 * Handles model_type "gemma4_text" (Gemma4ForCausalLM: keys at the top level, tensors under "model.") and the
 * text decoder of "gemma4" (Gemma4ForConditionalGeneration: keys under text_config, tensors under
 * "model.language_model."; vision/audio towers are skipped). The pieces: gemma4_config.c (config.json),
 * gemma4_weights.c (tensors), gemma4_rope.c (frequency tables), gemma4_forward.c (the step) and
 * gemma4_requirements.c (the op list the host checks against the backend).
 */
#include "gemma4_model.h"
#include "gemma4_rope.h"
#include "gemma4_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g4_model_types[] = {"gemma4_text", "gemma4", NULL};

static berth_status g4_accept(const berth_host *host, const berth_checkpoint *ck)
{
    int multimodal = 0;
    return g4_config_model_type(host, ck, &multimodal);
}

static void g4_destroy(berth_model *m)
{
    if (!m)
        return;
    if (m->be && m->be->vt) {
        m->be->vt->buffer_free(m->be->be, m->scratch_buf);
        m->be->vt->buffer_free(m->be->be, m->const_buf);
        m->be->vt->buffer_free(m->be->be, m->fused_buf);
    }
    for (int t = 0; t < G4_N_TYPES; t++)
        free(m->rope_freqs[t]);
    g4_req_free(m);
    g4_weights_free(m);
    g4_config_free(m->cfg);
    free(m);
}

static void fill_groups(berth_model *m)
{
    const struct g4_config *c = m->cfg;
    for (int g = 0; g < c->n_kv_groups; g++) {
        const int t = c->group_type[g];
        berth_kv_group_desc *d = &m->groups[g];
        memset(d, 0, sizeof *d);
        d->struct_size = sizeof *d;
        d->kind = t == G4_SLIDING ? BERTH_KV_SLIDING : BERTH_KV_FULL;
        d->window = t == G4_SLIDING ? c->window : 0;
        d->n_layers = c->group_layers[g];
        d->n_kv_heads = c->type_kv_heads[t];
        d->head_dim = d->head_dim_v = c->type_head_dim[t];
        snprintf(d->name, sizeof d->name, "%s", t == G4_SLIDING ? "sliding" : "full");
        m->group_ptrs[g] = d;
    }
}

static berth_status build_rope(berth_model *m)
{
    const struct g4_config *c = m->cfg;
    for (int t = 0; t < G4_N_TYPES; t++) {
        if (!c->type_used[t])
            continue;
        const int d = c->type_head_dim[t];
        m->rope_freqs[t] = calloc((size_t)(d / 2 > 0 ? d / 2 : 1), sizeof(float));
        if (!m->rope_freqs[t])
            return g4_fail(m->host, BERTH_E_NOMEM, "out of memory building RoPE tables");
        m->rope_pairs[t] = g4_rope_freqs(&c->rope[t], d, m->rope_freqs[t]);
    }
    return BERTH_OK;
}

static berth_status g4_create(const berth_host *host, const berth_checkpoint *ck, berth_model **out)
{
    berth_model *m = calloc(1, sizeof *m);
    if (!m)
        return g4_fail(host, BERTH_E_NOMEM, "out of memory creating the gemma4 model");
    m->host = host;
    berth_status st = g4_config_parse(host, ck, &m->cfg);
    if (st == BERTH_OK)
        st = build_rope(m);
    if (st == BERTH_OK)
        st = g4_weights_plan(m);
    if (st == BERTH_OK) {
        fill_groups(m);
        g4_weights_describe(m, ck);
        g4_weights_describe_fused(m);
        st = g4_requirements_build(m);
    }
    if (st != BERTH_OK) {
        g4_destroy(m);
        return st;
    }
    const struct g4_config *c = m->cfg;
    g4_log(host, BERTH_LOG_INFO,
           "%s: %d layers (%d KV-shared), hidden %d, heads %d, head dims %d/%d (sliding/full), window %d, PLE %d, "
           "softcap %g, %d distinct ops", c->model_type, c->n_layers, c->n_kv_shared, c->hidden, c->n_heads,
           c->type_head_dim[G4_SLIDING], c->type_head_dim[G4_FULL], c->window, c->ple_dim, c->softcap, m->n_reqs);
    *out = m;
    return BERTH_OK;
}

static berth_status g4_info(const berth_model *m, berth_model_info *out)
{
    const struct g4_config *c = m->cfg;
    berth_model_info v;
    memset(&v, 0, sizeof v);
    v.struct_size = out->struct_size;
    v.vocab_size = c->vocab;
    v.n_layers = c->n_layers;
    v.hidden_size = c->hidden;
    v.max_positions = c->max_positions;
    v.bos_id = c->bos_id;
    v.n_eos = c->n_eos;
    memcpy(v.eos_ids, c->eos_ids, sizeof v.eos_ids);
    v.is_encoder_decoder = 0;
    v.decoder_start_id = -1;
    snprintf(v.arch, sizeof v.arch, "%s", c->model_type);
    /* forward() enqueues the same ops for the same batch shape whatever the contents (gemma4_forward.c): the
     * host may record a decode step in a graph and replay it. */
    v.graph_safe = 1;
    /* Ids are read only on the device (embedding and per-layer-embedding gathers); h_tokens serves check_batch.
     * Sampled ids are < vocab, which must then also bound the per-layer table. */
    v.h_tokens_optional = c->ple_dim == 0 || c->ple_vocab >= c->vocab;
    /* Write only what the caller's struct holds. */
    size_t n = out->struct_size < sizeof v ? out->struct_size : sizeof v;
    memcpy(out, &v, n);
    return BERTH_OK;
}

static berth_status g4_memory_layout(const berth_model *m, berth_memory_layout *out)
{
    berth_memory_layout v;
    memset(&v, 0, sizeof v);
    v.struct_size = out->struct_size;
    v.n_kv_groups = m->cfg->n_kv_groups;
    v.kv_groups = m->group_ptrs;
    v.n_states = 0;
    v.states = NULL;
    size_t n = out->struct_size < sizeof v ? out->struct_size : sizeof v;
    memcpy(out, &v, n);
    return BERTH_OK;
}

static berth_status g4_requirements(const berth_model *m, const berth_requirement *const **out, int32_t *n)
{
    *out = (const berth_requirement *const *)m->reqs;
    *n = m->n_reqs;
    return BERTH_OK;
}

/* RoPE tables, uploaded once on the host's stream s and synced (the staging copy is freed right after). */
static berth_status upload_constants(berth_model *m, berth_stream *s)
{
    const berth_backend_api *be = m->be;
    uint64_t at = 0;
    for (int t = 0; t < G4_N_TYPES; t++) {
        m->rope_off[t] = at;
        at += (uint64_t)m->rope_pairs[t] * sizeof(float);
    }
    if (at == 0)
        return BERTH_OK;

    char *host = malloc(at);
    if (!host)
        return g4_fail(m->host, BERTH_E_NOMEM, "out of memory staging gemma4 constants");
    for (int t = 0; t < G4_N_TYPES; t++)
        if (m->rope_pairs[t] > 0)
            memcpy(host + m->rope_off[t], m->rope_freqs[t], (size_t)m->rope_pairs[t] * sizeof(float));

    berth_status st = be->vt->buffer_alloc(be->be, at, BERTH_USAGE_WEIGHTS, &m->const_buf);
    if (st == BERTH_OK)
        st = be->vt->buffer_upload(be->be, s, m->const_buf, 0, host, at);
    if (st == BERTH_OK)
        st = be->vt->stream_sync(be->be, s);
    free(host);
    return st;
}

static berth_status g4_load(berth_model *m, const berth_backend_api *be, const berth_load_params *lp)
{
    if (!be || !be->vt || !lp)
        return g4_fail(m->host, BERTH_E_INVALID, "gemma4: load needs a backend and load parameters");
    if (m->be)
        return g4_fail(m->host, BERTH_E_INVALID, "gemma4: load called twice");
    if (!BERTH_HAS(lp, berth_load_params, checkpoint) || !lp->checkpoint)
        return g4_fail(m->host, BERTH_E_ABI, "gemma4: load parameters lack the checkpoint");
    if (!BERTH_HAS(lp, berth_load_params, stream) || !lp->stream)
        return g4_fail(m->host, BERTH_E_ABI, "gemma4: load parameters lack the host's stream (ABI 0.2)");
    if (lp->max_batch_tokens < 1)
        return g4_fail(m->host, BERTH_E_INVALID, "gemma4: max_batch_tokens = %d must be positive",
                       lp->max_batch_tokens);
    if (lp->act_dtype != BERTH_DTYPE_F32)
        g4_log(m->host, BERTH_LOG_INFO, "gemma4 keeps activations in f32 (asked for %s)",
               g4_dtype_name(lp->act_dtype));
    m->be = be;
    berth_status st = g4_weights_bind(m, be, lp->checkpoint, lp->stream);
    if (st == BERTH_OK)
        st = g4_scratch_alloc(m, lp->max_batch_tokens);
    if (st == BERTH_OK)
        st = upload_constants(m, lp->stream);
    if (st == BERTH_OK)
        m->loaded = 1;
    return st;
}

static berth_status g4_counters(const berth_model *m, berth_counter *out, int32_t cap, int32_t *n)
{
    const berth_counter all[] = {
        {"forward_calls", m->n_forward_calls},
        {"prefill_tokens", m->n_prefill_tokens},
        {"decode_steps", m->n_decode_steps},
        {"logit_rows", m->n_logit_rows},
    };
    const int32_t count = (int32_t)(sizeof all / sizeof all[0]);
    for (int32_t i = 0; i < count && i < cap && out; i++)
        out[i] = all[i];
    *n = count;
    return BERTH_OK;
}

static const berth_model_vtable g4_vtable = {
    .struct_size = BERTH_SIZE_TO(berth_model_vtable, counters),
    .model_types = g4_model_types,
    .accept = g4_accept,
    .create = g4_create,
    .destroy = g4_destroy,
    .info = g4_info,
    .memory_layout = g4_memory_layout,
    .requirements = g4_requirements,
    .load = g4_load,
    .forward = g4_forward,
    .encode = NULL,
    .counters = g4_counters,
};

static const berth_plugin_desc g4_desc = {
    .magic = BERTH_PLUGIN_MAGIC,
    .struct_size = BERTH_SIZE_TO(berth_plugin_desc, vtable),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .kind = BERTH_PLUGIN_MODEL,
    .name = "gemma4",
    .version = "0.1.0",
    .description = "Gemma 4 text decoder (gemma4_text; text part of gemma4)",
    .required_services = BERTH_SVC_LOG | BERTH_SVC_CHECKPOINT | BERTH_SVC_TENSOR_LOAD,
    .vtable = &g4_vtable,
};

BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major, uint32_t host_abi_minor);

const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major, uint32_t host_abi_minor)
{
    (void)host_abi_minor;
    return host_abi_major == BERTH_ABI_MAJOR ? &g4_desc : NULL;
}

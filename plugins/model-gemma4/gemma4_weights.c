/*
 * gemma4_weights.c — which checkpoint tensors the Gemma 4 decoder needs (spec §2), their checks and binding.
 *
 * The plan lists every tensor with its exact PyTorch shape. Binding refuses a missing tensor, a dtype other
 * than f32/bf16/f16, a wrong shape, and any tensor under the text prefix the plan does not use, except the
 * k_proj/v_proj/k_norm/v_norm of KV-shared layers that HF itself ignores. Tensors outside the prefix (vision and
 * audio towers, embed_vision, embed_audio) are skipped. layer_scalar is read on the host and kept as a float.
 */
#include "gemma4_model.h"
#include "gemma4_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static berth_status plan_add(berth_model *m, int *cap, const char *name, berth_tensor *dst, float *scalar,
                             int ndim, int64_t s0, int64_t s1)
{
    if (m->n_plan == *cap) {
        int ncap = *cap ? 2 * *cap : 64;
        struct g4_plan_entry *np = realloc(m->plan, (size_t)ncap * sizeof *np);
        if (!np)
            return g4_fail(m->host, BERTH_E_NOMEM, "out of memory planning gemma4 tensors");
        m->plan = np;
        *cap = ncap;
    }
    struct g4_plan_entry *e = &m->plan[m->n_plan++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dst = dst;
    e->scalar = scalar;
    e->ndim = ndim;
    e->shape[0] = s0;
    e->shape[1] = s1;
    return BERTH_OK;
}

berth_status g4_weights_plan(berth_model *m)
{
    const struct g4_config *c = m->cfg;
    const char *pre = c->tensor_prefix;
    const int64_t D = c->hidden, Dp = c->ple_dim, L = c->n_layers, H = c->n_heads;
    struct g4_weights *w = &m->w;
    char n[160];
    int cap = 0;
    berth_status st = BERTH_OK;

    w->layers = calloc((size_t)c->n_layers, sizeof *w->layers);
    if (!w->layers)
        return g4_fail(m->host, BERTH_E_NOMEM, "out of memory planning gemma4 tensors");

#define ADD(dst, scal, nd, a, b, ...)                                                                           \
    do {                                                                                                        \
        snprintf(n, sizeof n, __VA_ARGS__);                                                                     \
        if ((st = plan_add(m, &cap, n, dst, scal, nd, a, b)) != BERTH_OK)                                       \
            return st;                                                                                          \
    } while (0)

    ADD(&w->embed, NULL, 2, c->vocab, D, "%sembed_tokens.weight", pre);
    if (Dp > 0) {
        ADD(&w->ple_embed, NULL, 2, c->ple_vocab, L * Dp, "%sembed_tokens_per_layer.weight", pre);
        ADD(&w->ple_model_proj, NULL, 2, L * Dp, D, "%sper_layer_model_projection.weight", pre);
        ADD(&w->ple_proj_norm, NULL, 1, Dp, 0, "%sper_layer_projection_norm.weight", pre);
    }
    ADD(&w->final_norm, NULL, 1, D, 0, "%snorm.weight", pre);
    if (!c->tied)
        ADD(&w->lm_head, NULL, 2, c->vocab, D, "lm_head.weight");

    for (int i = 0; i < c->n_layers; i++) {
        const struct g4_layer *ly = &c->layers[i];
        struct g4_layer_weights *lw = &w->layers[i];
        const int64_t hd = ly->head_dim, K = ly->n_kv_heads, I = ly->mlp_width;
        ADD(&lw->input_norm, NULL, 1, D, 0, "%slayers.%d.input_layernorm.weight", pre, i);
        ADD(&lw->q_proj, NULL, 2, H * hd, D, "%slayers.%d.self_attn.q_proj.weight", pre, i);
        ADD(&lw->q_norm, NULL, 1, hd, 0, "%slayers.%d.self_attn.q_norm.weight", pre, i);
        if (!ly->kv_shared) {
            ADD(&lw->k_proj, NULL, 2, K * hd, D, "%slayers.%d.self_attn.k_proj.weight", pre, i);
            if (!ly->v_from_k)
                ADD(&lw->v_proj, NULL, 2, K * hd, D, "%slayers.%d.self_attn.v_proj.weight", pre, i);
            ADD(&lw->k_norm, NULL, 1, hd, 0, "%slayers.%d.self_attn.k_norm.weight", pre, i);
        }
        ADD(&lw->o_proj, NULL, 2, D, H * hd, "%slayers.%d.self_attn.o_proj.weight", pre, i);
        ADD(&lw->post_attn_norm, NULL, 1, D, 0, "%slayers.%d.post_attention_layernorm.weight", pre, i);
        ADD(&lw->pre_ff_norm, NULL, 1, D, 0, "%slayers.%d.pre_feedforward_layernorm.weight", pre, i);
        ADD(&lw->gate_proj, NULL, 2, I, D, "%slayers.%d.mlp.gate_proj.weight", pre, i);
        ADD(&lw->up_proj, NULL, 2, I, D, "%slayers.%d.mlp.up_proj.weight", pre, i);
        ADD(&lw->down_proj, NULL, 2, D, I, "%slayers.%d.mlp.down_proj.weight", pre, i);
        ADD(&lw->post_ff_norm, NULL, 1, D, 0, "%slayers.%d.post_feedforward_layernorm.weight", pre, i);
        if (Dp > 0) {
            ADD(&lw->ple_gate, NULL, 2, Dp, D, "%slayers.%d.per_layer_input_gate.weight", pre, i);
            ADD(&lw->ple_proj, NULL, 2, D, Dp, "%slayers.%d.per_layer_projection.weight", pre, i);
            ADD(&lw->ple_post_norm, NULL, 1, D, 0, "%slayers.%d.post_per_layer_input_norm.weight", pre, i);
        }
        ADD(NULL, &lw->layer_scalar, 1, 1, 0, "%slayers.%d.layer_scalar", pre, i);
        lw->layer_scalar = 1.0f;
    }
#undef ADD
    return BERTH_OK;
}

static int weight_dtype_ok(berth_dtype t)
{
    return t == BERTH_DTYPE_F32 || t == BERTH_DTYPE_BF16 || t == BERTH_DTYPE_F16;
}

/* Shape-only tensor (ggml order) for an entry. */
static void shape_only(berth_tensor *t, const struct g4_plan_entry *e, berth_dtype dtype)
{
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = e->ndim;
    t->ne[0] = t->ne[1] = t->ne[2] = t->ne[3] = 1;
    for (int d = 0; d < e->ndim; d++)
        t->ne[d] = e->shape[e->ndim - 1 - d];
    g4_pack_strides(t);
}

void g4_weights_describe(berth_model *m, const berth_checkpoint *ck)
{
    const berth_host *h = m->host;
    for (int i = 0; i < m->n_plan; i++) {
        const struct g4_plan_entry *e = &m->plan[i];
        if (!e->dst)
            continue;
        berth_tensor_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        berth_dtype dt = BERTH_DTYPE_F32; /* a missing tensor is reported by load() */
        if (h->ckpt_tensor_find(h->ctx, ck, e->name, &info) == BERTH_OK && weight_dtype_ok(info.dtype))
            dt = info.dtype;
        shape_only(e->dst, e, dt);
    }
    if (m->cfg->tied)
        m->w.lm_head = m->w.embed;
}

static void shape_str(char *out, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(out, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(out + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < n)
        snprintf(out + k, n - k, "]");
}

/* Where a tensor lives, for messages about its contents: "DIR/SHARD.safetensors" when the host says which shard
 * holds it (berth_tensor_info.file, ABI 0.2), else the checkpoint directory. */
static const char *tensor_file(const char *dir, const berth_tensor_info *info, char *buf, size_t n)
{
    if (!BERTH_HAS(info, berth_tensor_info, file) || !info->file || !info->file[0])
        return dir;
    snprintf(buf, n, "%s/%s", dir, info->file);
    return buf;
}

static float half_to_float(uint16_t hv)
{
    unsigned sign = (hv >> 15) & 1u, ex = (hv >> 10) & 0x1fu, mant = hv & 0x3ffu;
    float v;
    if (ex == 0)
        v = ldexpf((float)mant, -24);
    else if (ex == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant | 0x400u), (int)ex - 25);
    return sign ? -v : v;
}

static berth_status read_scalar(const berth_model *m, const char *dir, const struct g4_plan_entry *e,
                                const berth_tensor_info *info)
{
    float v;
    char path[1200];
    const char *file = tensor_file(dir, info, path, sizeof path);
    if (!info->data || info->nbytes < g4_dtype_size(info->dtype))
        return g4_fail(m->host, BERTH_E_INVALID, "%s: tensor '%s' has no data", file, e->name);
    if (info->dtype == BERTH_DTYPE_F32) {
        memcpy(&v, info->data, sizeof v);
    } else {
        uint16_t hv;
        memcpy(&hv, info->data, sizeof hv);
        if (info->dtype == BERTH_DTYPE_BF16) {
            uint32_t bits = (uint32_t)hv << 16;
            memcpy(&v, &bits, sizeof v);
        } else {
            v = half_to_float(hv);
        }
    }
    if (!isfinite(v))
        return g4_fail(m->host, BERTH_E_INVALID, "%s: tensor '%s' holds a non-finite value", file, e->name);
    *e->scalar = v;
    return BERTH_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* k_proj/v_proj/k_norm/v_norm of a KV-shared layer: HF lists them as ignorable if present. */
static int ignorable(const struct g4_config *c, const char *bare)
{
    static const char *const names[] = {"self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                        "self_attn.k_norm.weight", "self_attn.v_norm.weight"};
    if (strncmp(bare, "layers.", 7) != 0 || bare[7] < '0' || bare[7] > '9')
        return 0;
    char *end = NULL;
    long idx = strtol(bare + 7, &end, 10);
    if (!end || *end != '.' || idx < c->first_shared || idx >= c->n_layers)
        return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(end + 1, names[i]) == 0)
            return 1;
    return 0;
}

/* Every tensor under the text prefix must be planned or ignorable. */
static berth_status check_unknown(berth_model *m, const berth_checkpoint *ck, const char *dir)
{
    const berth_host *h = m->host;
    const char *pre = m->cfg->tensor_prefix;
    const size_t plen = strlen(pre);
    berth_status st = BERTH_OK;
    const char **names = malloc((size_t)m->n_plan * sizeof *names);
    if (!names)
        return g4_fail(h, BERTH_E_NOMEM, "out of memory checking tensor names");
    for (int i = 0; i < m->n_plan; i++)
        names[i] = m->plan[i].name;
    qsort(names, (size_t)m->n_plan, sizeof *names, cmp_name);

    int64_t n = h->ckpt_tensor_count(h->ctx, ck);
    for (int64_t i = 0; i < n && st == BERTH_OK; i++) {
        berth_tensor_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if ((st = h->ckpt_tensor_at(h->ctx, ck, i, &info)) != BERTH_OK)
            break;
        const char *name = info.name;
        if (bsearch(&name, names, (size_t)m->n_plan, sizeof *names, cmp_name))
            continue;
        if (strcmp(name, "lm_head.weight") == 0) { /* only reached when tied: HF ties and drops it */
            g4_log(h, BERTH_LOG_WARN, "%s: tie_word_embeddings is true; tensor 'lm_head.weight' is ignored", dir);
            continue;
        }
        if (strncmp(name, pre, plen) != 0)
            continue; /* vision/audio towers and other non-text parts */
        if (ignorable(m->cfg, name + plen))
            continue;
        st = g4_fail(h, BERTH_E_INVALID, "%s: unknown tensor '%s' (not part of the gemma4 text decoder)", dir, name);
    }
    free(names);
    return st;
}

/* Does the bound tensor match the plan (dtype as stored, shape reversed, packed)? */
static int bound_matches(const berth_tensor *t, const struct g4_plan_entry *e, berth_dtype dtype)
{
    if (t->dtype != dtype || t->nb[0] != (int64_t)g4_dtype_size(dtype))
        return 0;
    for (int d = 0; d < 4; d++) {
        int64_t want = d < e->ndim ? e->shape[e->ndim - 1 - d] : 1;
        if (t->ne[d] != want)
            return 0;
    }
    return 1;
}

/* Present, dtype f32/bf16/f16, exact shape; fills *info. */
static berth_status check_entry(const berth_model *m, const berth_checkpoint *ck, const char *dir,
                                const struct g4_plan_entry *e, berth_tensor_info *info)
{
    const berth_host *h = m->host;
    char got[96], want[96];
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    berth_status st = h->ckpt_tensor_find(h->ctx, ck, e->name, info);
    if (st == BERTH_E_NOT_FOUND)
        return g4_fail(h, BERTH_E_NOT_FOUND, "%s: missing tensor '%s'", dir, e->name);
    if (st != BERTH_OK)
        return st;
    char path[1200];
    const char *file = tensor_file(dir, info, path, sizeof path);
    if (!weight_dtype_ok(info->dtype))
        return g4_fail(h, BERTH_E_UNSUPPORTED, "%s: tensor '%s' has dtype %s, expected f32, bf16 or f16", file,
                       e->name, g4_dtype_name(info->dtype));
    int same = info->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++)
        same = info->shape[d] == e->shape[d];
    if (!same) {
        shape_str(got, sizeof got, info->ndim < 0 ? 0 : info->ndim > 8 ? 8 : info->ndim, info->shape);
        shape_str(want, sizeof want, e->ndim, e->shape);
        return g4_fail(h, BERTH_E_INVALID, "%s: tensor '%s' has shape %s, expected %s", file, e->name, got, want);
    }
    return BERTH_OK;
}

/* --- fusion ---------------------------------------------------------------------------------------------------
 * Layout of m->fused_buf: per layer, [q|k|v rows] then [gate|up rows], each matrix 256-byte aligned. A layer's
 * group is fused only when its members share one dtype (a checkpoint could mix them); otherwise they stay apart. */

#define G4_FUSE_ALIGN 256u

/* The fused matrix a planned tensor belongs to: *whole = the fused tensor, *row0 = its first row in it. */
static int fused_member(berth_model *m, const berth_tensor *dst, berth_tensor **whole, int64_t *row0)
{
    for (int i = 0; i < m->cfg->n_layers; i++) {
        struct g4_layer_weights *lw = &m->w.layers[i];
        const struct g4_layer *ly = &m->cfg->layers[i];
        const int64_t nq = (int64_t)m->cfg->n_heads * ly->head_dim, nk = (int64_t)ly->n_kv_heads * ly->head_dim;
        if (lw->qkv.ne[0] && (dst == &lw->q_proj || dst == &lw->k_proj || dst == &lw->v_proj)) {
            *whole = &lw->qkv;
            *row0 = dst == &lw->q_proj ? 0 : dst == &lw->k_proj ? nq : nq + nk;
            return 1;
        }
        if (lw->gate_up.ne[0] && (dst == &lw->gate_proj || dst == &lw->up_proj)) {
            *whole = &lw->gate_up;
            *row0 = dst == &lw->gate_proj ? 0 : ly->mlp_width;
            return 1;
        }
    }
    return 0;
}

void g4_weights_describe_fused(berth_model *m)
{
    for (int i = 0; i < m->cfg->n_layers; i++) {
        struct g4_layer_weights *lw = &m->w.layers[i];
        const struct g4_layer *ly = &m->cfg->layers[i];
        memset(&lw->qkv, 0, sizeof lw->qkv);
        memset(&lw->gate_up, 0, sizeof lw->gate_up);
        if (!ly->kv_shared && lw->q_proj.dtype == lw->k_proj.dtype &&
            (ly->v_from_k || lw->q_proj.dtype == lw->v_proj.dtype)) {
            lw->qkv = lw->q_proj;
            lw->qkv.buf = NULL;
            lw->qkv.offset = 0;
            lw->qkv.ne[1] = lw->q_proj.ne[1] + lw->k_proj.ne[1] + (ly->v_from_k ? 0 : lw->v_proj.ne[1]);
            g4_pack_strides(&lw->qkv);
        }
        if (lw->gate_proj.dtype == lw->up_proj.dtype) {
            lw->gate_up = lw->gate_proj;
            lw->gate_up.buf = NULL;
            lw->gate_up.offset = 0;
            lw->gate_up.ne[1] = 2 * lw->gate_proj.ne[1];
            g4_pack_strides(&lw->gate_up);
        }
    }
}

/* Place every fused matrix in one buffer (offsets only; the buffer is allocated by the caller). */
static uint64_t fused_layout(berth_model *m)
{
    uint64_t at = 0;
    for (int i = 0; i < m->cfg->n_layers; i++) {
        struct g4_layer_weights *lw = &m->w.layers[i];
        berth_tensor *f[2] = {&lw->qkv, &lw->gate_up};
        for (int k = 0; k < 2; k++) {
            if (!f[k]->ne[0])
                continue;
            f[k]->offset = at;
            at += ((uint64_t)f[k]->nb[2] + G4_FUSE_ALIGN - 1) / G4_FUSE_ALIGN * G4_FUSE_ALIGN;
        }
    }
    return at;
}

/* The value of `key` in this plugin's config section ([model.gemma4]), NULL when unset or the host has no config
 * service. */
static const char *setting(const berth_host *h, const char *key)
{
    return BERTH_HAS(h, berth_host, config_get) && h->config_get ? h->config_get(h->ctx, key) : NULL;
}

/* [model.gemma4] fuse_projections = auto | true | false. auto fuses on a backend without BERTH_CAP_WRAP_HOST (it
 * copies the weights anyway); true also fuses where the weights could be used in place (tests run the fused path
 * on the CPU that way). */
static berth_status fuse_setting(const berth_model *m, const berth_backend_api *be, int *fuse)
{
    const berth_host *h = m->host;
    const char *v = setting(h, "fuse_projections");
    if (!v || !*v || strcmp(v, "auto") == 0)
        *fuse = be->device && !(be->device->caps & BERTH_CAP_WRAP_HOST);
    else if (strcmp(v, "true") == 0)
        *fuse = 1;
    else if (strcmp(v, "false") == 0)
        *fuse = 0;
    else
        return g4_fail(h, BERTH_E_INVALID, "[model.gemma4] fuse_projections = '%.60s' must be auto, true or false",
                       v);
    return BERTH_OK;
}

/* [model.gemma4] q_norm_in_kv_append = true | false (default true): where a layer stores K/V, its q-norm + RoPE
 * travel inside that kv_append (one launch fewer per layer); false sends them as an rms_norm, for A/B runs. */
static berth_status q_in_kv_setting(const berth_model *m, int *on)
{
    const berth_host *h = m->host;
    const char *v = setting(h, "q_norm_in_kv_append");
    if (!v || !*v || strcmp(v, "true") == 0)
        *on = 1;
    else if (strcmp(v, "false") == 0)
        *on = 0;
    else
        return g4_fail(h, BERTH_E_INVALID, "[model.gemma4] q_norm_in_kv_append = '%.60s' must be true or false", v);
    return BERTH_OK;
}

berth_status g4_weights_bind(berth_model *m, const berth_backend_api *be, const berth_checkpoint *ck,
                             berth_stream *s)
{
    const berth_host *h = m->host;
    const char *dir = h->ckpt_dir ? h->ckpt_dir(h->ctx, ck) : NULL;
    berth_tensor_info info;
    berth_status st;
    if (!dir)
        dir = "checkpoint";

    if ((st = q_in_kv_setting(m, &m->q_in_kv)) != BERTH_OK)
        return st;
    /* All metadata checks first, so a bad file fails before anything is uploaded. */
    for (int i = 0; i < m->n_plan; i++)
        if ((st = check_entry(m, ck, dir, &m->plan[i], &info)) != BERTH_OK)
            return st;
    if ((st = check_unknown(m, ck, dir)) != BERTH_OK)
        return st;

    /* Fuse where the backend copies weights anyway: the members are uploaded into the fused matrices below
     * instead of through tensor_load (memory is not doubled). */
    m->fused = 0;
    int fuse = 0;
    if ((st = fuse_setting(m, be, &fuse)) != BERTH_OK)
        return st;
    if (fuse) {
        g4_weights_describe(m, ck);
        g4_weights_describe_fused(m);
        uint64_t bytes = fused_layout(m);
        if (bytes > 0) {
            if ((st = be->vt->buffer_alloc(be->be, bytes, BERTH_USAGE_WEIGHTS, &m->fused_buf)) != BERTH_OK)
                return st;
            for (int i = 0; i < m->cfg->n_layers; i++) {
                m->w.layers[i].qkv.buf = m->w.layers[i].qkv.ne[0] ? m->fused_buf : NULL;
                m->w.layers[i].gate_up.buf = m->w.layers[i].gate_up.ne[0] ? m->fused_buf : NULL;
            }
            m->fused = 1;
            g4_log(h, BERTH_LOG_INFO, "gemma4: q|k|v and gate|up projections fused (%llu bytes of weights)",
                   (unsigned long long)bytes);
        }
    } else {
        for (int i = 0; i < m->cfg->n_layers; i++) {
            memset(&m->w.layers[i].qkv, 0, sizeof m->w.layers[i].qkv);
            memset(&m->w.layers[i].gate_up, 0, sizeof m->w.layers[i].gate_up);
        }
    }

    for (int i = 0; i < m->n_plan; i++) {
        const struct g4_plan_entry *e = &m->plan[i];
        if ((st = check_entry(m, ck, dir, e, &info)) != BERTH_OK)
            return st;
        if (!e->dst) {
            if ((st = read_scalar(m, dir, e, &info)) != BERTH_OK)
                return st;
            continue;
        }
        berth_tensor *whole;
        int64_t row0;
        if (m->fused && fused_member(m, e->dst, &whole, &row0)) {
            /* Rows [row0, row0 + rows) of the fused matrix: a packed view, filled from the file mapping. */
            const uint64_t off = whole->offset + (uint64_t)row0 * (uint64_t)whole->nb[1];
            if (!info.data || info.nbytes != (uint64_t)e->shape[0] * (uint64_t)whole->nb[1])
                return g4_fail(h, BERTH_E_INVALID, "%s: tensor '%s' has %llu bytes of data for shape [%lld, %lld]",
                               dir, e->name, (unsigned long long)info.nbytes, (long long)e->shape[0],
                               (long long)e->shape[1]);
            if ((st = be->vt->buffer_upload(be->be, s, m->fused_buf, off, info.data, info.nbytes)) != BERTH_OK)
                return st;
            shape_only(e->dst, e, info.dtype);
            e->dst->buf = m->fused_buf;
            e->dst->offset = off;
            continue;
        }
        if ((st = h->tensor_load(h->ctx, ck, be, e->name, e->dst)) != BERTH_OK)
            return st;
        if (!bound_matches(e->dst, e, info.dtype))
            return g4_fail(h, BERTH_E_INTERNAL, "%s: tensor_load of '%s' returned another dtype or shape than the "
                           "checkpoint header", dir, e->name);
    }
    if (m->cfg->tied)
        m->w.lm_head = m->w.embed;
    return BERTH_OK;
}

void g4_weights_free(berth_model *m)
{
    free(m->w.layers);
    m->w.layers = NULL;
    free(m->plan);
    m->plan = NULL;
    m->n_plan = 0;
}

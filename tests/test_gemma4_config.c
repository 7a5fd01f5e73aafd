/*
 * test_gemma4_config.c — the Gemma 4 plugin's config resolution, tensor checks and op wiring, without the host.
 *
 * The plugin's sources are compiled into this executable (no dlopen). A fake host implements the checkpoint
 * services over a jansson document and an in-memory tensor list; a fake backend allocates host memory and
 * records every op call, so load() and forward() can be checked before a real backend exists. Expected values
 * come from the spec (shared/specs/gemma4.md §1.3, §2, §3.6, §6), not from the plugin.
 */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <berth/model.h>

#include "gemma4_config.h"
#include "gemma4_rope.h"
#include "check_run.h"

/* ------------------------------------------------------------------------------------------------------------
 * Fake host */

static char g_err[1024];
static berth_status g_err_code;
static char g_log[8192];

struct fake_tensor {
    char name[160];
    berth_dtype dtype;
    int ndim;
    int64_t shape[8];
    unsigned char bytes[4]; /* data of one-element tensors (layer_scalar) */
};

struct fake_ck {
    json_t *cfg;
    struct fake_tensor *t;
    int n, cap;
};

static struct fake_ck *CK(const berth_checkpoint *ck)
{
    return (struct fake_ck *)(uintptr_t)ck;
}

static void fk_log(berth_host_ctx *ctx, int32_t level, const char *msg)
{
    (void)ctx, (void)level;
    size_t k = strlen(g_log);
    snprintf(g_log + k, sizeof g_log - k, "%s\n", msg);
}

static void fk_set_error(berth_host_ctx *ctx, berth_status code, const char *msg)
{
    (void)ctx;
    g_err_code = code;
    snprintf(g_err, sizeof g_err, "%s", msg);
}

/* '.'-separated path: object member by key, array element by decimal index. */
static json_t *walk(const berth_checkpoint *ck, const char *path)
{
    json_t *node = CK(ck)->cfg;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    if (!buf[0])
        return node;
    for (char *seg = strtok(buf, "."); seg && node; seg = strtok(NULL, ".")) {
        if (json_is_object(node))
            node = json_object_get(node, seg);
        else if (json_is_array(node))
            node = json_array_get(node, (size_t)strtoul(seg, NULL, 10));
        else
            node = NULL;
    }
    return node;
}

static int32_t fk_type(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path)
{
    (void)ctx;
    json_t *v = walk(ck, path);
    if (!v)
        return BERTH_JSON_MISSING;
    switch (json_typeof(v)) {
    case JSON_NULL: return BERTH_JSON_NULL;
    case JSON_TRUE:
    case JSON_FALSE: return BERTH_JSON_BOOL;
    case JSON_INTEGER: return BERTH_JSON_INT;
    case JSON_REAL: return BERTH_JSON_REAL;
    case JSON_STRING: return BERTH_JSON_STRING;
    case JSON_ARRAY: return BERTH_JSON_ARRAY;
    default: return BERTH_JSON_OBJECT;
    }
}

static berth_status fk_int(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out)
{
    (void)ctx;
    json_t *v = walk(ck, path);
    if (!v)
        return BERTH_E_NOT_FOUND;
    if (!json_is_integer(v))
        return BERTH_E_INVALID;
    *out = json_integer_value(v);
    return BERTH_OK;
}

static berth_status fk_real(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, double *out)
{
    (void)ctx;
    json_t *v = walk(ck, path);
    if (!v)
        return BERTH_E_NOT_FOUND;
    if (!json_is_number(v))
        return BERTH_E_INVALID;
    *out = json_number_value(v);
    return BERTH_OK;
}

static berth_status fk_bool(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int32_t *out)
{
    (void)ctx;
    json_t *v = walk(ck, path);
    if (!v)
        return BERTH_E_NOT_FOUND;
    if (!json_is_boolean(v))
        return BERTH_E_INVALID;
    *out = json_is_true(v);
    return BERTH_OK;
}

static berth_status fk_string(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, const char **out)
{
    (void)ctx;
    json_t *v = walk(ck, path);
    if (!v)
        return BERTH_E_NOT_FOUND;
    if (!json_is_string(v))
        return BERTH_E_INVALID;
    *out = json_string_value(v);
    return BERTH_OK;
}

static berth_status fk_len(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out)
{
    (void)ctx;
    json_t *v = walk(ck, path);
    if (!v)
        return BERTH_E_NOT_FOUND;
    if (json_is_array(v))
        *out = (int64_t)json_array_size(v);
    else if (json_is_object(v))
        *out = (int64_t)json_object_size(v);
    else
        return BERTH_E_INVALID;
    return BERTH_OK;
}

static berth_status fk_key(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t idx,
                           const char **out)
{
    (void)ctx;
    json_t *v = walk(ck, path);
    if (!v || !json_is_object(v))
        return BERTH_E_NOT_FOUND;
    void *it = json_object_iter(v);
    for (int64_t i = 0; it && i < idx; i++)
        it = json_object_iter_next(v, it);
    if (!it)
        return BERTH_E_NOT_FOUND;
    *out = json_object_iter_key(it);
    return BERTH_OK;
}

static const char *fk_dir(berth_host_ctx *ctx, const berth_checkpoint *ck)
{
    (void)ctx, (void)ck;
    return "tiny";
}

static int64_t fk_count(berth_host_ctx *ctx, const berth_checkpoint *ck)
{
    (void)ctx;
    return CK(ck)->n;
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const struct fake_tensor *)a)->name, ((const struct fake_tensor *)b)->name);
}

/* The fake checkpoint has two shards: MLP weights in the second, the rest in the first. g_no_file plays a host
 * older than ABI 0.2, which leaves berth_tensor_info.file unset. */
static int g_no_file;
static const char *fake_shard(const struct fake_tensor *t)
{
    return strstr(t->name, ".mlp.") ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
}

static void fill_info(const struct fake_tensor *t, berth_tensor_info *out)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    out->dtype = t->dtype;
    out->name = t->name;
    out->data = t->bytes;
    out->nbytes = (uint64_t)n * (t->dtype == BERTH_DTYPE_F32 ? 4u : 2u);
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    if (!g_no_file && BERTH_HAS(out, berth_tensor_info, file))
        out->file = fake_shard(t);
}

static berth_status fk_at(berth_host_ctx *ctx, const berth_checkpoint *ck, int64_t idx, berth_tensor_info *out)
{
    (void)ctx;
    struct fake_ck *f = CK(ck);
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_tensor);
    if (idx < 0 || idx >= f->n)
        return BERTH_E_NOT_FOUND;
    fill_info(&f->t[idx], out);
    return BERTH_OK;
}

static struct fake_tensor *find_tensor(struct fake_ck *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}

static berth_status fk_find(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *name,
                            berth_tensor_info *out)
{
    struct fake_tensor *t = find_tensor(CK(ck), name);
    if (!t) {
        char msg[256];
        snprintf(msg, sizeof msg, "no tensor '%s'", name);
        fk_set_error(ctx, BERTH_E_NOT_FOUND, msg);
        return BERTH_E_NOT_FOUND;
    }
    fill_info(t, out);
    return BERTH_OK;
}

static int g_loads;
static berth_status fk_load(berth_host_ctx *ctx, const berth_checkpoint *ck, const berth_backend_api *be,
                            const char *name, berth_tensor *out)
{
    (void)ctx, (void)be;
    struct fake_tensor *t = find_tensor(CK(ck), name);
    if (!t)
        return BERTH_E_NOT_FOUND;
    memset(out, 0, sizeof *out);
    out->buf = (berth_buffer *)(uintptr_t)0x1000; /* never dereferenced by the model */
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    for (int d = 0; d < 4; d++)
        out->ne[d] = d < t->ndim ? t->shape[t->ndim - 1 - d] : 1;
    out->nb[0] = t->dtype == BERTH_DTYPE_F32 ? 4 : 2;
    for (int d = 1; d < 4; d++)
        out->nb[d] = out->nb[d - 1] * out->ne[d - 1];
    g_loads++;
    return BERTH_OK;
}

static berth_host g_host = {
    .struct_size = sizeof(berth_host),
    .abi_major = BERTH_ABI_MAJOR,
    .abi_minor = BERTH_ABI_MINOR,
    .host_version = "test",
    .services = BERTH_SVC_LOG | BERTH_SVC_CHECKPOINT | BERTH_SVC_TENSOR_LOAD,
    .log = fk_log,
    .set_error = fk_set_error,
    .ckpt_cfg_type = fk_type,
    .ckpt_cfg_int = fk_int,
    .ckpt_cfg_real = fk_real,
    .ckpt_cfg_bool = fk_bool,
    .ckpt_cfg_string = fk_string,
    .ckpt_cfg_len = fk_len,
    .ckpt_cfg_key = fk_key,
    .ckpt_dir = fk_dir,
    .ckpt_tensor_count = fk_count,
    .ckpt_tensor_at = fk_at,
    .ckpt_tensor_find = fk_find,
    .tensor_load = fk_load,
};

static struct fake_ck *ck_new(const char *json)
{
    json_error_t e;
    struct fake_ck *f = calloc(1, sizeof *f);
    f->cfg = json_loads(json, 0, &e);
    ck_assert_msg(f->cfg != NULL, "bad test JSON: %s (line %d)", e.text, e.line);
    g_err[0] = '\0';
    g_err_code = 0;
    g_log[0] = '\0';
    return f;
}

static void ck_free(struct fake_ck *f)
{
    json_decref(f->cfg);
    free(f->t);
    free(f);
}

static const berth_checkpoint *CKP(struct fake_ck *f)
{
    return (const berth_checkpoint *)f;
}

/* ------------------------------------------------------------------------------------------------------------
 * Configs */

/* Spec §6 as written by a 5.17 save_pretrained: per_layer_config with keys "2", "5"; no global_head_dim. */
static const char *TINY =
    "{\"model_type\": \"gemma4_text\", \"architectures\": [\"Gemma4ForCausalLM\"],"
    " \"vocab_size\": 256, \"vocab_size_per_layer_input\": 256, \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 6,"
    " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\","
    "                   \"sliding_attention\", \"full_attention\"],"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16,"
    " \"per_layer_config\": {\"2\": {\"head_dim\": 32}, \"5\": {\"head_dim\": 32}},"
    " \"sliding_window\": 8, \"num_kv_shared_layers\": 3, \"use_double_wide_mlp\": true,"
    " \"hidden_size_per_layer_input\": 8, \"final_logit_softcapping\": 1.0, \"initializer_range\": 0.1,"
    " \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": true,"
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"attention_k_eq_v\": false, \"enable_moe_block\": false,"
    " \"num_experts\": null, \"top_k_experts\": null, \"moe_intermediate_size\": null,"
    " \"use_bidirectional_attention\": null, \"attention_bias\": false,"
    " \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0},"
    "                       \"full_attention\": {\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25,"
    "                                            \"rope_theta\": 1000000.0}},"
    " \"bos_token_id\": 2, \"eos_token_id\": 1, \"pad_token_id\": 0, \"dtype\": \"float32\"}";

/* Official multimodal E2B form (spec §1.3 "else" branch, §7): global_head_dim, period-5 layer types. */
static json_t *e2b_json(void)
{
    json_t *tc = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:o, s:s}",
                           "vocab_size", 262144, "vocab_size_per_layer_input", 262144, "hidden_size", 1536,
                           "intermediate_size", 6144, "num_hidden_layers", 35, "num_attention_heads", 8,
                           "num_key_value_heads", 1, "head_dim", 256, "global_head_dim", 512, "sliding_window", 512,
                           "num_kv_shared_layers", 20, "hidden_size_per_layer_input", 256, "use_double_wide_mlp", 1,
                           "final_logit_softcapping", 30.0, "rope_theta", json_null(), "model_type", "gemma4_text");
    json_t *lt = json_array();
    for (int i = 0; i < 35; i++)
        json_array_append_new(lt, json_string((i + 1) % 5 == 0 ? "full_attention" : "sliding_attention"));
    json_object_set_new(tc, "layer_types", lt);
    json_object_set_new(tc, "eos_token_id", json_integer(1));
    json_t *root = json_pack("{s:s, s:o, s:{s:i}, s:[i,i], s:i}", "model_type", "gemma4", "text_config", tc,
                             "vision_config", "hidden_size", 768, "eos_token_id", 1, 106, "image_token_id", 258880);
    return root;
}

static struct fake_ck *ck_from(json_t *root)
{
    char *s = json_dumps(root, JSON_PRESERVE_ORDER);
    json_decref(root);
    struct fake_ck *f = ck_new(s);
    free(s);
    return f;
}

/* TINY with one top-level key replaced (value given as JSON text; NULL removes the key). */
static struct fake_ck *tiny_with(const char *key, const char *value)
{
    json_error_t e;
    json_t *root = json_loads(TINY, 0, &e);
    ck_assert(root != NULL);
    if (value) {
        json_t *v = json_loads(value, JSON_DECODE_ANY, &e);
        ck_assert_msg(v != NULL, "bad value JSON for %s: %s", key, e.text);
        json_object_set_new(root, key, v);
    } else {
        json_object_del(root, key);
    }
    return ck_from(root);
}

static struct g4_config *parse_ok(struct fake_ck *f)
{
    struct g4_config *c = NULL;
    berth_status st = g4_config_parse(&g_host, CKP(f), &c);
    ck_assert_msg(st == BERTH_OK, "parse failed (%d): %s", st, g_err);
    ck_assert_ptr_nonnull(c);
    return c;
}

static void parse_fails(struct fake_ck *f, berth_status code, const char *msg)
{
    struct g4_config *c = NULL;
    berth_status st = g4_config_parse(&g_host, CKP(f), &c);
    ck_assert_int_eq(st, code);
    ck_assert_ptr_null(c);
    ck_assert_str_eq(g_err, msg);
    ck_free(f);
}

/* ------------------------------------------------------------------------------------------------------------
 * Resolution */

START_TEST(tiny_per_layer_config)
{
    struct fake_ck *f = ck_new(TINY);
    struct g4_config *c = parse_ok(f);
    const int hd[6] = {16, 16, 32, 16, 16, 32};
    const int type[6] = {G4_SLIDING, G4_SLIDING, G4_FULL, G4_SLIDING, G4_SLIDING, G4_FULL};
    const int src[6] = {0, 1, 2, 1, 1, 2}; /* §3.6: shared sliding layers read layer 1 (not 0), full read 2 */
    const int mlp[6] = {128, 128, 128, 256, 256, 256};
    ck_assert_str_eq(c->tensor_prefix, "model.");
    ck_assert_str_eq(c->model_type, "gemma4_text");
    ck_assert_int_eq(c->first_shared, 3);
    ck_assert_int_eq(c->window, 8);
    ck_assert_int_eq(c->ple_dim, 8);
    ck_assert_int_eq(c->ple_vocab, 256);
    ck_assert(fabs(c->softcap - 1.0) < 1e-12);
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(c->layers[i].type, type[i]);
        ck_assert_int_eq(c->layers[i].head_dim, hd[i]);
        ck_assert_int_eq(c->layers[i].n_kv_heads, 2);
        ck_assert_int_eq(c->layers[i].kv_src, src[i]);
        ck_assert_int_eq(c->layers[i].kv_shared, i >= 3);
        ck_assert_int_eq(c->layers[i].mlp_width, mlp[i]);
    }
    /* Groups: sliding {layers 0, 1}, full {layer 2}; a layer's cache index is its source's. */
    ck_assert_int_eq(c->n_kv_groups, 2);
    ck_assert_int_eq(c->group_type[0], G4_SLIDING);
    ck_assert_int_eq(c->group_layers[0], 2);
    ck_assert_int_eq(c->group_type[1], G4_FULL);
    ck_assert_int_eq(c->group_layers[1], 1);
    const int grp[6] = {0, 0, 1, 0, 0, 1}, idx[6] = {0, 1, 0, 1, 1, 0};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(c->layers[i].kv_group, grp[i]);
        ck_assert_int_eq(c->layers[i].kv_index, idx[i]);
    }
    ck_assert_int_eq(c->bos_id, 2);
    ck_assert_int_eq(c->n_eos, 1);
    ck_assert_int_eq(c->eos_ids[0], 1);
    g4_config_free(c);
    ck_free(f);
}
END_TEST

START_TEST(e2b_official_form)
{
    struct fake_ck *f = ck_from(e2b_json());
    struct g4_config *c = parse_ok(f);
    ck_assert_str_eq(c->tensor_prefix, "model.language_model.");
    ck_assert_str_eq(c->model_type, "gemma4");
    ck_assert_int_eq(c->first_shared, 15);
    for (int i = 0; i < 35; i++) {
        const struct g4_layer *ly = &c->layers[i];
        int full = (i + 1) % 5 == 0;
        ck_assert_int_eq(ly->type, full ? G4_FULL : G4_SLIDING);
        ck_assert_int_eq(ly->head_dim, full ? 512 : 256);
        ck_assert_int_eq(ly->n_kv_heads, 1);
        ck_assert_int_eq(ly->mlp_width, i >= 15 ? 12288 : 6144);
        if (i >= 15)
            ck_assert_int_eq(ly->kv_src, full ? 14 : 13); /* spec §3.6: E2B reads 13 / 14 */
        else
            ck_assert_int_eq(ly->kv_src, i);
    }
    ck_assert_int_eq(c->group_layers[0], 12);
    ck_assert_int_eq(c->group_layers[1], 3);
    /* eos: union of text_config (1) and the top level ([1, 106]) */
    ck_assert_int_eq(c->n_eos, 2);
    ck_assert_int_eq(c->eos_ids[0], 1);
    ck_assert_int_eq(c->eos_ids[1], 106);
    ck_assert_int_eq(c->bos_id, 2);
    g4_config_free(c);
    ck_free(f);
}
END_TEST

START_TEST(global_head_dim_absent_is_512)
{
    json_t *root = e2b_json();
    json_object_del(json_object_get(root, "text_config"), "global_head_dim");
    struct fake_ck *f = ck_from(root);
    struct g4_config *c = parse_ok(f);
    ck_assert_int_eq(c->layers[4].head_dim, 512);
    ck_assert_int_eq(c->layers[3].head_dim, 256);
    g4_config_free(c);
    ck_free(f);

    /* Same on the tiny config without per_layer_config: full layers get 512, not head_dim (16). */
    f = tiny_with("per_layer_config", NULL);
    c = parse_ok(f);
    ck_assert_int_eq(c->layers[2].head_dim, 512);
    ck_assert_int_eq(c->layers[0].head_dim, 16);
    g4_config_free(c);
    ck_free(f);
}
END_TEST

START_TEST(global_kv_heads_only_with_k_eq_v)
{
    json_t *root = e2b_json();
    json_t *tc = json_object_get(root, "text_config");
    json_object_set_new(tc, "num_key_value_heads", json_integer(4));
    json_object_set_new(tc, "num_global_key_value_heads", json_integer(2));
    json_object_set_new(tc, "num_kv_shared_layers", json_integer(0));
    struct fake_ck *f = ck_from(json_deep_copy(root));
    struct g4_config *c = parse_ok(f);
    ck_assert_int_eq(c->layers[4].n_kv_heads, 4); /* ignored without attention_k_eq_v */
    ck_assert_int_eq(c->layers[4].v_from_k, 0);
    g4_config_free(c);
    ck_free(f);

    json_object_set_new(tc, "attention_k_eq_v", json_true());
    f = ck_from(root);
    c = parse_ok(f);
    ck_assert_int_eq(c->layers[4].n_kv_heads, 2);
    ck_assert_int_eq(c->layers[4].v_from_k, 1);
    ck_assert_int_eq(c->layers[3].n_kv_heads, 4);
    ck_assert_int_eq(c->layers[3].v_from_k, 0);
    g4_config_free(c);
    ck_free(f);
}
END_TEST

START_TEST(zero_padded_keys)
{
    json_t *root = json_loads(TINY, 0, NULL);
    json_t *lt = json_array();
    for (int i = 0; i < 12; i++)
        json_array_append_new(lt, json_string((i + 1) % 6 == 0 ? "full_attention" : "sliding_attention"));
    json_object_set_new(root, "num_hidden_layers", json_integer(12));
    json_object_set_new(root, "num_kv_shared_layers", json_integer(0));
    json_object_set_new(root, "layer_types", lt);
    json_object_set_new(root, "per_layer_config",
                        json_pack("{s:{s:i, s:i}, s:{s:i, s:i}}", "05", "head_dim", 32, "num_key_value_heads", 1,
                                  "11", "head_dim", 32, "num_key_value_heads", 1));
    struct fake_ck *f = ck_from(root);
    struct g4_config *c = parse_ok(f);
    for (int i = 0; i < 12; i++) {
        int full = i == 5 || i == 11;
        ck_assert_int_eq(c->layers[i].head_dim, full ? 32 : 16);
        ck_assert_int_eq(c->layers[i].n_kv_heads, full ? 1 : 2);
        ck_assert_int_eq(c->layers[i].mlp_width, 128); /* no shared layers: no double width */
    }
    g4_config_free(c);
    ck_free(f);
}
END_TEST

START_TEST(last_layer_forced_full)
{
    /* [S,S,F,S,S,S]: HF rewrites the last entry to full; per_layer_config then has to cover it like layer 2. */
    struct fake_ck *f = tiny_with("layer_types", "[\"sliding_attention\", \"sliding_attention\", \"full_attention\","
                                                 " \"sliding_attention\", \"sliding_attention\", \"sliding_attention\"]");
    struct g4_config *c = parse_ok(f);
    ck_assert_int_eq(c->layers[5].type, G4_FULL);
    ck_assert_int_eq(c->layers[5].head_dim, 32);
    ck_assert_int_eq(c->layers[5].kv_src, 2);
    ck_assert_ptr_nonnull(strstr(g_log, "layer_types[5] is sliding_attention; the last layer always uses full "
                                        "attention"));
    g4_config_free(c);
    ck_free(f);

    /* Default layer_types (period 6) on 4 layers: only the forced last layer is full. */
    f = tiny_with("layer_types", NULL);
    json_object_set_new(f->cfg, "num_hidden_layers", json_integer(4));
    json_object_set_new(f->cfg, "num_kv_shared_layers", json_integer(0));
    json_object_set_new(f->cfg, "per_layer_config", json_pack("{s:{s:i}}", "3", "head_dim", 32));
    c = parse_ok(f);
    ck_assert_int_eq(c->layers[0].type, G4_SLIDING);
    ck_assert_int_eq(c->layers[2].type, G4_SLIDING);
    ck_assert_int_eq(c->layers[3].type, G4_FULL);
    ck_assert_int_eq(c->layers[3].head_dim, 32);
    g4_config_free(c);
    ck_free(f);
}
END_TEST

START_TEST(eos_list_and_defaults)
{
    struct fake_ck *f = tiny_with("eos_token_id", "[1, 106, 1]");
    struct g4_config *c = parse_ok(f);
    ck_assert_int_eq(c->n_eos, 2);
    ck_assert_int_eq(c->eos_ids[1], 106);
    g4_config_free(c);
    ck_free(f);

    f = tiny_with("eos_token_id", NULL);
    json_object_del(f->cfg, "bos_token_id");
    c = parse_ok(f);
    ck_assert_int_eq(c->n_eos, 1);
    ck_assert_int_eq(c->eos_ids[0], 1);
    ck_assert_int_eq(c->bos_id, 2);
    g4_config_free(c);
    ck_free(f);
}
END_TEST

START_TEST(rope_tables)
{
    struct fake_ck *f = ck_new(TINY);
    struct g4_config *c = parse_ok(f);
    float fr[64];
    /* sliding: default, d = 16, all 8 pairs, f_j = 1e4^(-2j/16) */
    ck_assert_int_eq(g4_rope_freqs(&c->rope[G4_SLIDING], 16, fr), 8);
    for (int j = 0; j < 8; j++)
        ck_assert_double_eq_tol(fr[j], pow(1e4, -2.0 * j / 16.0), 1e-6 * pow(1e4, -2.0 * j / 16.0));
    /* full: proportional 0.25, d = 32 -> n = 4 pairs, exponent over the full d (§3.4) */
    ck_assert_int_eq(g4_rope_freqs(&c->rope[G4_FULL], 32, fr), 4);
    for (int j = 0; j < 4; j++)
        ck_assert_double_eq_tol(fr[j], pow(1e6, -2.0 * j / 32.0), 1e-6 * pow(1e6, -2.0 * j / 32.0));
    /* official full layers: d = 512 -> 64 pairs, f_1 = 0.94746, f_63 = 0.033376 (spec §3.4) */
    ck_assert_int_eq(g4_rope_freqs(&c->rope[G4_FULL], 512, fr), 64);
    ck_assert_double_eq_tol(fr[0], 1.0, 1e-7);
    ck_assert_double_eq_tol(fr[1], 0.94746, 1e-5);
    ck_assert_double_eq_tol(fr[63], 0.033376, 1e-6);
    g4_config_free(c);
    ck_free(f);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Rejections: each names config.json, the key and the value. */

START_TEST(reject_unsupported_features)
{
    parse_fails(tiny_with("enable_moe_block", "true"), BERTH_E_UNSUPPORTED,
                "config.json: enable_moe_block = true: enable_moe_block is not supported yet by the gemma4 plugin");
    parse_fails(tiny_with("attention_bias", "true"), BERTH_E_UNSUPPORTED,
                "config.json: attention_bias = true is not supported by the gemma4 plugin (no known checkpoint "
                "uses it)");
    parse_fails(tiny_with("use_bidirectional_attention", "\"all\""), BERTH_E_UNSUPPORTED,
                "config.json: use_bidirectional_attention = 'all' is not supported (gemma4 runs causal text "
                "attention; only null and 'vision' are accepted)");
    parse_fails(tiny_with("hidden_activation", "\"silu\""), BERTH_E_UNSUPPORTED,
                "config.json: hidden_activation = 'silu' is not supported (gemma4 uses gelu_pytorch_tanh)");
    parse_fails(tiny_with("rope_parameters",
                          "{\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0},"
                          " \"full_attention\": {\"rope_type\": \"yarn\", \"rope_theta\": 1000000.0}}"),
                BERTH_E_UNSUPPORTED,
                "config.json: rope_parameters.full_attention.rope_type = 'yarn' is not supported (gemma4 handles "
                "default, proportional)");
    /* "vision" is a no-op for text and accepted */
    struct fake_ck *f = tiny_with("use_bidirectional_attention", "\"vision\"");
    g4_config_free(parse_ok(f));
    ck_free(f);
}
END_TEST

START_TEST(reject_illegal_geometry)
{
    parse_fails(tiny_with("head_dim", "15"), BERTH_E_INVALID,
                "config.json: head_dim = 15 is odd; head dims must be even (sliding_attention layers)");
    parse_fails(tiny_with("per_layer_config", "{\"2\": {\"head_dim\": 33}, \"5\": {\"head_dim\": 33}}"),
                BERTH_E_INVALID,
                "config.json: per_layer_config.2.head_dim = 33 is odd; head dims must be even (full_attention layers)");
    parse_fails(tiny_with("num_key_value_heads", "3"), BERTH_E_INVALID,
                "config.json: num_attention_heads = 4 is not divisible by num_key_value_heads = 3 (sliding_attention "
                "layers)");
    parse_fails(tiny_with("num_kv_shared_layers", "6"), BERTH_E_INVALID,
                "config.json: num_kv_shared_layers = 6 must be less than num_hidden_layers = 6");
    struct fake_ck *f = tiny_with("layer_types", "[\"full_attention\", \"full_attention\", \"full_attention\","
                                                 " \"sliding_attention\", \"sliding_attention\", \"full_attention\"]");
    json_object_del(f->cfg, "per_layer_config");
    parse_fails(f, BERTH_E_INVALID,
                "config.json: KV-shared layer 3 (sliding_attention) has no earlier non-shared sliding_attention layer "
                "to read from (num_kv_shared_layers = 3 leaves layers 0..2)");
    parse_fails(tiny_with("sliding_window", "1"), BERTH_E_INVALID,
                "config.json: sliding_window = 1 is too small; sliding layers need a window of at least 2");
    parse_fails(tiny_with("layer_types", "[\"sliding_attention\", \"local\", \"full_attention\","
                                         " \"sliding_attention\", \"sliding_attention\", \"full_attention\"]"),
                BERTH_E_INVALID,
                "config.json: layer_types.1 = 'local' is not a layer type (sliding_attention, full_attention)");
    parse_fails(tiny_with("layer_types", "[\"sliding_attention\", \"full_attention\"]"), BERTH_E_INVALID,
                "config.json: layer_types has 2 entries, expected num_hidden_layers = 6");
}
END_TEST

START_TEST(reject_per_layer_config)
{
    parse_fails(tiny_with("per_layer_config", "{\"2\": {\"head_dim\": 32, \"intermediate_size\": 256},"
                                              " \"5\": {\"head_dim\": 32}}"),
                BERTH_E_UNSUPPORTED,
                "config.json: per_layer_config.2 overrides 'intermediate_size'; gemma4 only handles head_dim and "
                "num_key_value_heads overrides");
    parse_fails(tiny_with("per_layer_config", "{\"2\": {\"head_dim\": 32}, \"5\": {\"head_dim\": 64}}"),
                BERTH_E_INVALID,
                "config.json: per_layer_config gives layer 5 (full_attention) other overrides than layer 2 (head_dim "
                "64 vs 32, num_key_value_heads -1 vs -1; -1 = not overridden); all layers of one type must match");
    parse_fails(tiny_with("per_layer_config", "{\"2\": {\"head_dim\": 32}}"), BERTH_E_INVALID,
                "config.json: per_layer_config gives layer 5 (full_attention) other overrides than layer 2 (head_dim "
                "-1 vs 32, num_key_value_heads -1 vs -1; -1 = not overridden); all layers of one type must match");
    parse_fails(tiny_with("per_layer_config", "{\"x2\": {\"head_dim\": 32}}"), BERTH_E_INVALID,
                "config.json: per_layer_config key 'x2' is not a layer index");
    parse_fails(tiny_with("per_layer_config", "{\"9\": {\"head_dim\": 32}}"), BERTH_E_INVALID,
                "config.json: per_layer_config key '9' is not a layer index (num_hidden_layers = 6)");
    parse_fails(tiny_with("per_layer_config",
                          "{\"2\": {\"head_dim\": 32}, \"5\": {\"head_dim\": 32}, \"05\": {\"head_dim\": 32}}"),
                BERTH_E_INVALID, "config.json: per_layer_config has both '5' and '05' for layer 5");
}
END_TEST

START_TEST(reject_bad_values)
{
    parse_fails(tiny_with("hidden_size", "\"64\""), BERTH_E_INVALID,
                "config.json: hidden_size must be an integer, got a string");
    parse_fails(tiny_with("vocab_size", "0"), BERTH_E_INVALID,
                "config.json: vocab_size = 0 is out of range [1, 2147483647]");
    parse_fails(tiny_with("hidden_size", "null"), BERTH_E_INVALID,
                "config.json: hidden_size must be an integer, got null");
    parse_fails(tiny_with("final_logit_softcapping", "0"), BERTH_E_INVALID,
                "config.json: final_logit_softcapping = 0 must be positive (or null for none)");
    parse_fails(tiny_with("eos_token_id", "\"1\""), BERTH_E_INVALID,
                "config.json: eos_token_id must be an integer or a list of integers, got a string");

    json_t *root = e2b_json();
    json_object_set_new(json_object_get(root, "text_config"), "head_dim", json_integer(255));
    parse_fails(ck_from(root), BERTH_E_INVALID,
                "config.json: text_config.head_dim = 255 is odd; head dims must be even (sliding_attention layers)");
    root = e2b_json();
    json_object_del(root, "text_config");
    parse_fails(ck_from(root), BERTH_E_INVALID, "config.json: model_type 'gemma4' needs a text_config object, got "
                                                "nothing");
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Descriptor, accept, create/info/layout/requirements through the vtable */

const berth_plugin_desc *berth_plugin_entry(uint32_t host_abi_major, uint32_t host_abi_minor);

static const berth_model_vtable *VT(void)
{
    const berth_plugin_desc *d = berth_plugin_entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    ck_assert_ptr_nonnull(d);
    return d->vtable;
}

START_TEST(descriptor_and_accept)
{
    const berth_plugin_desc *d = berth_plugin_entry(BERTH_ABI_MAJOR, BERTH_ABI_MINOR);
    ck_assert_ptr_nonnull(d);
    ck_assert_uint_eq(d->magic, BERTH_PLUGIN_MAGIC);
    ck_assert_int_eq(d->kind, BERTH_PLUGIN_MODEL);
    ck_assert_str_eq(d->name, "gemma4");
    ck_assert_uint_eq(d->required_services, BERTH_SVC_LOG | BERTH_SVC_CHECKPOINT | BERTH_SVC_TENSOR_LOAD);
    ck_assert_ptr_null(berth_plugin_entry(BERTH_ABI_MAJOR + 1, 0));
    const berth_model_vtable *vt = d->vtable;
    ck_assert_str_eq(vt->model_types[0], "gemma4_text");
    ck_assert_str_eq(vt->model_types[1], "gemma4");
    ck_assert_ptr_null(vt->model_types[2]);

    struct fake_ck *f = ck_new(TINY);
    ck_assert_int_eq(vt->accept(&g_host, CKP(f)), BERTH_OK);
    ck_free(f);
    f = ck_from(e2b_json());
    ck_assert_int_eq(vt->accept(&g_host, CKP(f)), BERTH_OK);
    ck_free(f);
    f = ck_new("{\"model_type\": \"llama\"}");
    ck_assert_int_eq(vt->accept(&g_host, CKP(f)), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(g_err, "model_type 'llama' is not handled by gemma4 (handles gemma4_text, gemma4)");
    ck_free(f);
    f = ck_new("{\"hidden_size\": 64}");
    ck_assert_int_eq(vt->accept(&g_host, CKP(f)), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(g_err, "config.json has no model_type string; gemma4 handles gemma4_text, gemma4");
    ck_free(f);
}
END_TEST

static int starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static int count_reqs(const berth_requirement *const *r, int n, int op)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += r[i]->op == op;
    return k;
}

START_TEST(create_info_layout_requirements)
{
    const berth_model_vtable *vt = VT();
    struct fake_ck *f = ck_new(TINY);
    berth_model *m = NULL;
    ck_assert_int_eq(vt->create(&g_host, CKP(f), &m), BERTH_OK);

    berth_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    ck_assert_int_eq(vt->info(m, &info), BERTH_OK);
    ck_assert_int_eq(info.vocab_size, 256);
    ck_assert_int_eq(info.n_layers, 6);
    ck_assert_int_eq(info.hidden_size, 64);
    ck_assert_int_eq(info.max_positions, 256);
    ck_assert_int_eq(info.bos_id, 2);
    ck_assert_int_eq(info.n_eos, 1);
    ck_assert_int_eq(info.eos_ids[0], 1);
    ck_assert_str_eq(info.arch, "gemma4_text");

    berth_memory_layout ml;
    memset(&ml, 0, sizeof ml);
    ml.struct_size = sizeof ml;
    ck_assert_int_eq(vt->memory_layout(m, &ml), BERTH_OK);
    ck_assert_int_eq(ml.n_kv_groups, 2);
    ck_assert_int_eq(ml.n_states, 0);
    ck_assert_int_eq(ml.kv_groups[0]->kind, BERTH_KV_SLIDING);
    ck_assert_int_eq(ml.kv_groups[0]->window, 8);
    ck_assert_int_eq(ml.kv_groups[0]->n_layers, 2);
    ck_assert_int_eq(ml.kv_groups[0]->n_kv_heads, 2);
    ck_assert_int_eq(ml.kv_groups[0]->head_dim, 16);
    ck_assert_int_eq(ml.kv_groups[0]->head_dim_v, 16);
    ck_assert_str_eq(ml.kv_groups[0]->name, "sliding");
    ck_assert_int_eq(ml.kv_groups[1]->kind, BERTH_KV_FULL);
    ck_assert_int_eq(ml.kv_groups[1]->window, 0);
    ck_assert_int_eq(ml.kv_groups[1]->n_layers, 1);
    ck_assert_int_eq(ml.kv_groups[1]->head_dim, 32);
    ck_assert_str_eq(ml.kv_groups[1]->name, "full");

    const berth_requirement *const *r = NULL;
    int32_t n = 0;
    ck_assert_int_eq(vt->requirements(m, &r, &n), BERTH_OK);
    ck_assert_int_gt(n, 0);
    /* two attention geometries: hd 16 window 8 and hd 32 window 0, both scale 1 */
    ck_assert_int_eq(count_reqs(r, n, BERTH_OP_ATTENTION), 2);
    /* ... stored through kv_append with the query side (q-norm + RoPE inside) */
    ck_assert_int_eq(count_reqs(r, n, BERTH_OP_KV_APPEND), 2);
    /* q RoPE is part of the q_norm rms_norm, the GLUs are matmul epilogues: no rope or glu op of their own */
    ck_assert_int_eq(count_reqs(r, n, BERTH_OP_ROPE), 0);
    ck_assert_int_eq(count_reqs(r, n, BERTH_OP_GLU), 0);
    int seen16 = 0, seen32 = 0, n_rope_norms = 0, n_scaled_norms = 0, n_second = 0;
    int n_pre_attn = 0, n_pre_ff = 0, n_pre_ple = 0, n_alone_ple = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_ptr_nonnull(r[i]);
        ck_assert_uint_eq(r[i]->struct_size, sizeof(berth_requirement));
        ck_assert_ptr_nonnull(r[i]->what);
        ck_assert_ptr_nonnull(r[i]->params);
        if (r[i]->op == BERTH_OP_ATTENTION) {
            const berth_attention_params *p = r[i]->params;
            ck_assert(p->q.buf == NULL && p->kv.k_buf == NULL);
            ck_assert(p->scale == 1.0f);
            if (p->kv.head_dim == 16 && p->window == 8 && p->q.ne[1] == 4 && p->kv.n_kv_heads == 2)
                seen16 = 1;
            if (p->kv.head_dim == 32 && p->window == 0)
                seen32 = 1;
        }
        if (r[i]->op == BERTH_OP_KV_APPEND) {
            const berth_kv_append_params *p = r[i]->params;
            ck_assert_int_eq(p->k_norm_mode, BERTH_NORM_W);
            ck_assert_int_eq(p->v_norm_mode, BERTH_NORM_UNIT); /* weightless norm, no weight tensor */
            ck_assert_int_eq(p->v_norm.ne[0], 0);               /* absent in a query */
            ck_assert_int_eq(p->k_norm.ne[0], p->kv.head_dim);
            ck_assert_uint_eq(p->kv.v_head_stride, (uint64_t)p->kv.head_dim_v * 4u);
            ck_assert_uint_eq(p->kv.v_token_stride, (uint64_t)p->kv.n_kv_heads * p->kv.v_head_stride);
            ck_assert_int_eq(p->rope_mode, BERTH_ROPE_HALF);
            ck_assert_int_eq(p->rope_n_pairs, p->kv.head_dim == 16 ? 8 : 4);
            ck_assert_int_eq(p->rope_pair_offset, p->kv.head_dim / 2);
        }
        if (r[i]->op == BERTH_OP_MATMUL) /* a missing checkpoint reads as f32 here */
            ck_assert_int_eq(((const berth_matmul_params *)r[i]->params)->w.dtype, BERTH_DTYPE_F32);
        /* a norm is an rms_norm op or a matmul's norm before the product (x_pre: each post-norm goes with the
         * product that reads its output, whose x is the norm's y2, else its y); no trailing norms (y_norm), also
         * not on the PLE projection, the PLE gate's second product (y_then) */
        const berth_matmul_params *mp = r[i]->op == BERTH_OP_MATMUL ? r[i]->params : NULL;
        const berth_rms_norm_params *xp = mp ? mp->x_pre : NULL;
        const berth_matmul_params *yt = mp ? mp->y_then : NULL;
        const berth_rms_norm_params *tn = yt ? yt->y_norm : NULL;
        if (mp)
            ck_assert_msg(mp->y_norm == NULL, "%s", r[i]->what);
        if (yt) {
            ck_assert_msg(xp && !tn && !yt->x_pre && !yt->y_then, "%s", r[i]->what);
            ck_assert_mem_eq(&yt->x, &mp->y, sizeof mp->y);
            ck_assert_int_eq(yt->w.ne[0], 8); /* [hidden 64, ple 8] */
            ck_assert_int_eq(yt->w.ne[1], 64);
            ck_assert_msg(strstr(r[i]->what, ", then a matmul of y by a f32 weight [64, 8])"), "%s", r[i]->what);
        }
        if (xp) {
            const char *what = r[i]->what;
            const int y2 = xp->y2.ne[0] != 0;
            ck_assert_mem_eq(y2 ? &xp->y2 : &xp->y, &mp->x, sizeof mp->x);
            ck_assert_int_eq(xp->rope_n_pairs, 0);
            ck_assert_int_eq(xp->resid_mode, BERTH_RESID_ADD_AFTER);
            ck_assert_int_eq(mp->x_norm_mode, BERTH_NORM_W_NONE);
            ck_assert_msg(strstr(what, ", x from an rms_norm before it") != NULL, "%s", what);
            if (starts(what, "matmul post_attention_layernorm (+ pre_feedforward_layernorm), then mlp.")) {
                ck_assert(y2 && xp->out_scale == 0.0f); /* the pre-FF norm into gate|up, or up */
                n_pre_attn++;
            } else if (starts(what, "matmul post_feedforward_layernorm, then per_layer_input_gate, "
                                    "per_layer_projection (")) {
                ck_assert(!y2 && xp->out_scale == 0.0f && mp->y_glu == BERTH_GLU_MUL && yt);
                n_pre_ff++;
            } else if (starts(what, "matmul post_per_layer_input_norm (* layer_scalar, + input_layernorm), "
                                    "then q_proj")) {
                ck_assert(y2 && xp->out_scale != 0.0f); /* the next layer's input norm into q|k|v, or q */
                n_pre_ple++;
            } else {
                ck_abort_msg("unexpected norm before a product: %s", what);
            }
        }
        if (r[i]->op == BERTH_OP_RMS_NORM &&
            starts(r[i]->what, "rms_norm post_per_layer_input_norm (* layer_scalar) (")) {
            /* the last layer's last norm: no product reads it (the final norm follows the row gather) */
            ck_assert_int_eq(((const berth_rms_norm_params *)r[i]->params)->y2.ne[0], 0);
            n_alone_ple++;
        }
        const berth_rms_norm_params *norms[2] = {r[i]->op == BERTH_OP_RMS_NORM ? r[i]->params : xp, tn};
        for (int k = 0; k < 2; k++) {
            const berth_rms_norm_params *p = norms[k];
            if (!p)
                continue;
            if (p->rope_n_pairs > 0) { /* q_norm + RoPE: per head, positions per token, the type's pairs */
                ck_assert_int_eq(p->rope_mode, BERTH_ROPE_HALF);
                ck_assert_int_eq(p->rope_pair_offset, p->x.ne[0] / 2);
                ck_assert_int_eq(p->rope_n_pairs, p->x.ne[0] == 16 ? 8 : 4);
                ck_assert_int_eq(p->x.ne[1], 4);
                ck_assert_int_eq(p->rope_positions.ne[0], p->x.ne[2]);
                ck_assert_int_eq(p->rope_freqs.ne[0], p->rope_n_pairs);
                ck_assert_int_eq(p->resid_mode, BERTH_RESID_NONE);
                n_rope_norms++;
            }
            n_scaled_norms += p->out_scale != 0.0f;
            if (p->y2.ne[0] != 0) { /* post-norms that also write the next projection's pre-norm */
                ck_assert_int_eq(p->resid_mode, BERTH_RESID_ADD_AFTER);
                ck_assert_int_eq(p->y2_weight_mode, BERTH_NORM_W);
                ck_assert_int_eq(p->y2_w.ne[0], p->x.ne[0]);
                ck_assert_int_eq(p->y2.ne[0], p->y.ne[0]);
                ck_assert_int_eq(p->y2.ne[1], p->y.ne[1]);
                ck_assert_int_eq(p->y2.dtype, BERTH_DTYPE_F32);
                n_second++;
            }
        }
    }
    ck_assert(seen16 && seen32);
    ck_assert_int_eq(n_rope_norms, 2);
    /* norms before a product, one requirement per distinct consumer: the post-attention norm with up_proj and
     * with gate|up at both MLP widths (128, 256), the post-FF norm with the PLE pair (gate, then projection), the
     * post-PLE norm with the next layer's q_proj or fused q|k|v: 64 rows (sliding q), 128 (full q; a sliding q|k|v
     * has the same shape and parameters) and 256 (full q|k|v) */
    ck_assert_int_eq(n_pre_attn, 4);
    ck_assert_int_eq(n_pre_ff, 1);
    ck_assert_int_eq(n_pre_ple, 3);
    ck_assert_int_eq(n_alone_ple, 1);
    /* out_scale: the per-layer input norm (* 2^-1/2) and post_per_layer_input_norm (* layer_scalar), alone after
     * the last layer and before each of its consumers */
    ck_assert_int_eq(n_scaled_norms, 2 + n_pre_ple);
    /* second outputs: the post-attention norm (+ pre_feedforward_layernorm) and the post-PLE norm (+ the next
     * input_layernorm), each in front of its consumers */
    ck_assert_int_eq(n_second, n_pre_attn + n_pre_ple);
    int found = 0;
    for (int i = 0; i < n; i++)
        found |= strcmp(r[i]->what, "attention sliding layers (head_dim 16, 4 heads / 2 kv heads, causal, window 8, "
                                   "scale 1, f32 cache)") == 0;
    ck_assert_msg(found, "no readable attention requirement");
    /* input_layernorm and pre_feedforward_layernorm are never rms_norm ops of their own: the previous norm's
     * second output, or (layer 0's q/k/v projections, which no norm precedes) the matmul's norm prologue */
    int prologues = 0;
    for (int i = 0; i < n; i++) {
        ck_assert_msg(strncmp(r[i]->what, "rms_norm input_layernorm", 24) != 0 &&
                          strncmp(r[i]->what, "rms_norm pre_feedforward_layernorm", 34) != 0,
                      "separate norm op left: %s", r[i]->what);
        if (r[i]->op != BERTH_OP_MATMUL)
            continue;
        const berth_matmul_params *p = r[i]->params;
        const int want = strstr(r[i]->what, "(input_layernorm prologue") != NULL;
        if (want)
            ck_assert(strstr(r[i]->what, "q_proj") || strstr(r[i]->what, "k_proj") || strstr(r[i]->what, "v_proj"));
        ck_assert_msg(p->x_norm_mode == (want ? BERTH_NORM_W : BERTH_NORM_W_NONE), "%s: x_norm_mode %d", r[i]->what,
                      p->x_norm_mode);
        if (want) {
            ck_assert_int_eq(p->x_norm_w.ne[0], p->x.ne[0]);
            ck_assert(p->x_norm_eps > 0.0f);
            ck_assert_ptr_nonnull(strstr(r[i]->what, "RMS-norm prologue with f32 weight"));
            prologues++;
        }
    }
    ck_assert_int_gt(prologues, 0);
    /* the GELU-tanh GLUs: gate|up halves (fused weights), gate_proj times up_proj's output, the PLE gate times
     * the layer's per-layer input */
    int halves = 0, mul_mlp = 0, mul_ple = 0;
    for (int i = 0; i < n; i++) {
        if (r[i]->op != BERTH_OP_MATMUL)
            continue;
        const berth_matmul_params *p = r[i]->params;
        if (p->y_glu == BERTH_GLU_NONE)
            continue;
        ck_assert_int_eq(p->y_glu_act, BERTH_ACT_GELU_TANH);
        ck_assert_int_eq(p->accumulate, 0);
        if (p->y_glu == BERTH_GLU_HALVES) {
            ck_assert_int_eq(p->w.ne[1], 2 * p->y.ne[0]);
            ck_assert_int_eq(p->y_glu_up.ne[0], 0); /* absent */
            halves++;
        } else {
            ck_assert_int_eq(p->y_glu, BERTH_GLU_MUL);
            ck_assert_int_eq(p->y_glu_up.ne[0], p->y.ne[0]);
            ck_assert_int_eq(p->y_glu_up.ne[1], p->y.ne[1]);
            mul_mlp += strstr(r[i]->what, "mlp.gate_proj") != NULL;
            mul_ple += strstr(r[i]->what, "per_layer_input_gate") != NULL;
        }
    }
    ck_assert_int_eq(halves, 2); /* two MLP widths (128, 256) */
    ck_assert_int_eq(mul_mlp, 2);
    ck_assert_int_eq(mul_ple, 1);
    vt->destroy(m);
    ck_free(f);
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * Tensors of the tiny checkpoint, written from spec §2 */

static struct fake_tensor *add_t(struct fake_ck *f, berth_dtype dt, int ndim, int64_t a, int64_t b, const char *fmt,
                                 ...)
{
    if (f->n == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 128;
        f->t = realloc(f->t, (size_t)f->cap * sizeof *f->t);
    }
    struct fake_tensor *t = &f->t[f->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = b;
    return t;
}

static void remove_t(struct fake_ck *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) {
            f->t[i] = f->t[--f->n];
            return;
        }
    ck_abort_msg("no tensor %s to remove", name);
}

static const float SCALAR[6] = {0.5f, 0.75f, 1.25f, 1.5f, 0.625f, 1.0f};

static void tiny_tensors(struct fake_ck *f, const char *pre, berth_dtype dt)
{
    const int64_t D = 64, V = 256, L = 6, H = 4, Dp = 8, K = 2;
    const int64_t hd[6] = {16, 16, 32, 16, 16, 32}, I[6] = {128, 128, 128, 256, 256, 256};
    add_t(f, dt, 2, V, D, "%sembed_tokens.weight", pre);
    add_t(f, dt, 2, V, L * Dp, "%sembed_tokens_per_layer.weight", pre);
    add_t(f, dt, 2, L * Dp, D, "%sper_layer_model_projection.weight", pre);
    add_t(f, dt, 1, Dp, 0, "%sper_layer_projection_norm.weight", pre);
    add_t(f, dt, 1, D, 0, "%snorm.weight", pre);
    for (int i = 0; i < 6; i++) {
        add_t(f, dt, 1, D, 0, "%slayers.%d.input_layernorm.weight", pre, i);
        add_t(f, dt, 2, H * hd[i], D, "%slayers.%d.self_attn.q_proj.weight", pre, i);
        add_t(f, dt, 1, hd[i], 0, "%slayers.%d.self_attn.q_norm.weight", pre, i);
        if (i < 3) {
            add_t(f, dt, 2, K * hd[i], D, "%slayers.%d.self_attn.k_proj.weight", pre, i);
            add_t(f, dt, 2, K * hd[i], D, "%slayers.%d.self_attn.v_proj.weight", pre, i);
            add_t(f, dt, 1, hd[i], 0, "%slayers.%d.self_attn.k_norm.weight", pre, i);
        }
        add_t(f, dt, 2, D, H * hd[i], "%slayers.%d.self_attn.o_proj.weight", pre, i);
        add_t(f, dt, 1, D, 0, "%slayers.%d.post_attention_layernorm.weight", pre, i);
        add_t(f, dt, 1, D, 0, "%slayers.%d.pre_feedforward_layernorm.weight", pre, i);
        add_t(f, dt, 2, I[i], D, "%slayers.%d.mlp.gate_proj.weight", pre, i);
        add_t(f, dt, 2, I[i], D, "%slayers.%d.mlp.up_proj.weight", pre, i);
        add_t(f, dt, 2, D, I[i], "%slayers.%d.mlp.down_proj.weight", pre, i);
        add_t(f, dt, 1, D, 0, "%slayers.%d.post_feedforward_layernorm.weight", pre, i);
        add_t(f, dt, 2, Dp, D, "%slayers.%d.per_layer_input_gate.weight", pre, i);
        add_t(f, dt, 2, D, Dp, "%slayers.%d.per_layer_projection.weight", pre, i);
        add_t(f, dt, 1, D, 0, "%slayers.%d.post_per_layer_input_norm.weight", pre, i);
        struct fake_tensor *s = add_t(f, dt, 1, 1, 0, "%slayers.%d.layer_scalar", pre, i);
        if (dt == BERTH_DTYPE_F32) {
            memcpy(s->bytes, &SCALAR[i], 4);
        } else { /* the values are exact in bf16: keep the top half */
            uint32_t bits;
            memcpy(&bits, &SCALAR[i], 4);
            uint16_t top = (uint16_t)(bits >> 16);
            memcpy(s->bytes, &top, 2);
        }
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * Fake backend: host memory buffers, recorded op calls */

struct fake_buf {
    unsigned char *mem;
    uint64_t n;
};

#define MAX_CALLS 512
struct call {
    int op;
    union {
        berth_matmul_params mm;
        berth_get_rows_params gr;
        berth_rms_norm_params rn;
        berth_rope_params ro;
        berth_unary_params un;
        berth_glu_params gl;
        berth_kv_append_params kv;
        berth_attention_params at;
    } p;
};
static struct call g_calls[MAX_CALLS];
static int g_ncalls;
static int g_n_x_pre;  /* matmuls that came with a norm before the product */
static int g_n_y_then; /* matmuls that came with a second product (y_then) */

static berth_status fb_alloc(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out)
{
    (void)be, (void)usage;
    struct fake_buf *b = calloc(1, sizeof *b);
    b->mem = calloc(1, nbytes ? nbytes : 1);
    b->n = nbytes;
    *out = (berth_buffer *)b;
    return BERTH_OK;
}
static void fb_free(berth_backend *be, berth_buffer *buf)
{
    (void)be;
    struct fake_buf *b = (struct fake_buf *)buf;
    if (b)
        free(b->mem);
    free(b);
}
/* The host's stream handed to load() (berth_load_params.stream); uploads and syncs must use it, and the model
 * must create no stream of its own. */
static int g_host_stream;
static int g_streams_created, g_uploads_elsewhere, g_syncs_on_host_stream;
static berth_status fb_stream_create(berth_backend *be, berth_stream **out)
{
    (void)be;
    g_streams_created++;
    *out = (berth_stream *)calloc(1, 8);
    return BERTH_OK;
}
static void fb_stream_destroy(berth_backend *be, berth_stream *s)
{
    (void)be;
    free(s);
}
static berth_status fb_sync(berth_backend *be, berth_stream *s)
{
    (void)be;
    g_syncs_on_host_stream += s == (berth_stream *)&g_host_stream;
    return BERTH_OK;
}
static berth_status fb_upload(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t off, const void *src,
                              uint64_t n)
{
    (void)be;
    g_uploads_elsewhere += s != (berth_stream *)&g_host_stream;
    struct fake_buf *b = (struct fake_buf *)dst;
    ck_assert_uint_le(off + n, b->n);
    memcpy(b->mem + off, src, n);
    return BERTH_OK;
}

#define FB_OP(name, type, field, opid)                                                                         \
    static berth_status fb_##name(berth_backend *be, berth_stream *s, const type *p)                          \
    {                                                                                                          \
        (void)be, (void)s;                                                                                     \
        ck_assert_int_lt(g_ncalls, MAX_CALLS);                                                                 \
        g_calls[g_ncalls].op = opid;                                                                           \
        g_calls[g_ncalls].p.field = *p;                                                                        \
        g_ncalls++;                                                                                            \
        return BERTH_OK;                                                                                       \
    }
/* A matmul with a norm before it (x_pre) is recorded as that rms_norm as a call of its own, then the matmul; one
 * with a trailing norm (y_norm) as the matmul, then that rms_norm; one with a second product (y_then) as the
 * matmul, then that one (and its y_norm): each means exactly that sequence. */
static berth_status fb_matmul(berth_backend *be, berth_stream *s, const berth_matmul_params *p)
{
    (void)be, (void)s;
    ck_assert_int_lt(g_ncalls + 1, MAX_CALLS);
    ck_assert_msg(!(p->x_pre && p->y_norm), "a matmul with both x_pre and y_norm");
    if (p->x_pre) {
        const berth_rms_norm_params *n = p->x_pre;
        ck_assert_mem_eq(n->y2.ne[0] != 0 ? &n->y2 : &n->y, &p->x, sizeof p->x);
        g_calls[g_ncalls].op = BERTH_OP_RMS_NORM;
        g_calls[g_ncalls].p.rn = *n;
        g_ncalls++;
        g_n_x_pre++;
    }
    g_calls[g_ncalls].op = BERTH_OP_MATMUL;
    g_calls[g_ncalls].p.mm = *p;
    g_calls[g_ncalls].p.mm.y_norm = NULL; /* points into the caller's frame */
    g_calls[g_ncalls].p.mm.x_pre = NULL;
    g_calls[g_ncalls].p.mm.y_then = NULL;
    g_ncalls++;
    if (p->y_norm) {
        ck_assert_mem_eq(&p->y_norm->x, &p->y, sizeof p->y);
        g_calls[g_ncalls].op = BERTH_OP_RMS_NORM;
        g_calls[g_ncalls].p.rn = *p->y_norm;
        g_ncalls++;
    }
    if (p->y_then) {
        const berth_matmul_params *q = p->y_then;
        ck_assert_msg(!p->y_norm && !q->x_pre && !q->y_then, "y_then with a y_norm before it or an x_pre / y_then");
        ck_assert_mem_eq(&q->x, &p->y, sizeof p->y);
        g_n_y_then++;
        return fb_matmul(be, s, q);
    }
    return BERTH_OK;
}
FB_OP(get_rows, berth_get_rows_params, gr, BERTH_OP_GET_ROWS)
FB_OP(rms_norm, berth_rms_norm_params, rn, BERTH_OP_RMS_NORM)
FB_OP(rope, berth_rope_params, ro, BERTH_OP_ROPE)
FB_OP(unary, berth_unary_params, un, BERTH_OP_UNARY)
FB_OP(glu, berth_glu_params, gl, BERTH_OP_GLU)
FB_OP(kv_append, berth_kv_append_params, kv, BERTH_OP_KV_APPEND)
FB_OP(attention, berth_attention_params, at, BERTH_OP_ATTENTION)

static const berth_ops g_ops = {
    .struct_size = sizeof(berth_ops),
    .matmul = fb_matmul,
    .get_rows = fb_get_rows,
    .rms_norm = fb_rms_norm,
    .rope = fb_rope,
    .unary = fb_unary,
    .glu = fb_glu,
    .kv_append = fb_kv_append,
    .attention = fb_attention,
};
static const berth_backend_vtable g_bvt = {
    .struct_size = sizeof(berth_backend_vtable),
    .stream_create = fb_stream_create,
    .stream_destroy = fb_stream_destroy,
    .stream_sync = fb_sync,
    .buffer_alloc = fb_alloc,
    .buffer_free = fb_free,
    .buffer_upload = fb_upload,
};
static const berth_backend_api g_be = {
    .struct_size = sizeof(berth_backend_api), .vt = &g_bvt, .ops = &g_ops};

static berth_load_params load_params(struct fake_ck *f)
{
    berth_load_params lp;
    memset(&lp, 0, sizeof lp);
    lp.struct_size = sizeof lp;
    lp.max_batch_tokens = 16;
    lp.max_seqs = 4;
    lp.act_dtype = BERTH_DTYPE_F32;
    lp.kv_dtype = BERTH_DTYPE_F32;
    lp.checkpoint = CKP(f);
    lp.stream = (berth_stream *)&g_host_stream;
    return lp;
}

/* create + load; returns the load status, *out the model (destroy it). */
static berth_status create_load(struct fake_ck *f, berth_model **out)
{
    const berth_model_vtable *vt = VT();
    berth_model *m = NULL;
    ck_assert_int_eq(vt->create(&g_host, CKP(f), &m), BERTH_OK);
    berth_load_params lp = load_params(f);
    g_loads = 0;
    g_streams_created = g_uploads_elsewhere = g_syncs_on_host_stream = 0;
    *out = m;
    return vt->load(m, &g_be, &lp);
}

static void load_fails(struct fake_ck *f, berth_status code, const char *msg)
{
    berth_model *m = NULL;
    ck_assert_int_eq(create_load(f, &m), code);
    ck_assert_str_eq(g_err, msg);
    VT()->destroy(m);
    ck_free(f);
}

START_TEST(load_binds_spec_tensor_set)
{
    struct fake_ck *f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    ck_assert_int_eq(f->n, 98); /* spec §6: 98 tensors, no lm_head */
    berth_model *m = NULL;
    ck_assert_msg(create_load(f, &m) == BERTH_OK, "load: %s", g_err);
    ck_assert_int_eq(g_loads, 98 - 6); /* every tensor but the six host-read layer scalars */
    /* the RoPE tables went up on the host's stream, which was synced; no private stream */
    ck_assert_int_eq(g_streams_created, 0);
    ck_assert_int_eq(g_uploads_elsewhere, 0);
    ck_assert_int_ge(g_syncs_on_host_stream, 1);
    VT()->destroy(m);
    ck_free(f);

    /* a host older than ABI 0.2 passes no stream: refused, not guessed */
    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    m = NULL;
    ck_assert_int_eq(VT()->create(&g_host, CKP(f), &m), BERTH_OK);
    berth_load_params old = load_params(f);
    old.struct_size = (uint32_t)BERTH_SIZE_TO(berth_load_params, checkpoint);
    ck_assert_int_eq(VT()->load(m, &g_be, &old), BERTH_E_ABI);
    ck_assert_str_eq(g_err, "gemma4: load parameters lack the host's stream (ABI 0.2)");
    VT()->destroy(m);
    ck_free(f);

    /* bf16 checkpoint; matmul requirements then carry bf16 weights */
    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_BF16);
    m = NULL;
    ck_assert_int_eq(VT()->create(&g_host, CKP(f), &m), BERTH_OK);
    const berth_requirement *const *r = NULL;
    int32_t n = 0;
    VT()->requirements(m, &r, &n);
    for (int i = 0; i < n; i++)
        if (r[i]->op == BERTH_OP_MATMUL && strstr(r[i]->what, "q_proj"))
            ck_assert_int_eq(((const berth_matmul_params *)r[i]->params)->w.dtype, BERTH_DTYPE_BF16);
    berth_load_params lp = load_params(f);
    ck_assert_msg(VT()->load(m, &g_be, &lp) == BERTH_OK, "load: %s", g_err);
    VT()->destroy(m);
    ck_free(f);
}
END_TEST

START_TEST(load_tolerates_ignorable_and_foreign_tensors)
{
    /* multimodal: text under model.language_model., towers skipped, shared-layer k_proj/v_proj/k_norm ignored */
    json_t *root = json_pack("{s:s, s:o}", "model_type", "gemma4", "text_config", json_loads(TINY, 0, NULL));
    struct fake_ck *f = ck_from(root);
    tiny_tensors(f, "model.language_model.", BERTH_DTYPE_F32);
    add_t(f, BERTH_DTYPE_F32, 2, 4, 4, "model.vision_tower.encoder.layers.0.mlp.fc1.weight");
    add_t(f, BERTH_DTYPE_F32, 2, 4, 4, "model.embed_vision.embedding_projection.weight");
    add_t(f, BERTH_DTYPE_F32, 2, 64, 64, "model.audio_tower.conv.weight");
    add_t(f, BERTH_DTYPE_F32, 2, 32, 64, "model.language_model.layers.4.self_attn.k_proj.weight");
    add_t(f, BERTH_DTYPE_F32, 2, 32, 64, "model.language_model.layers.4.self_attn.v_proj.weight");
    add_t(f, BERTH_DTYPE_F32, 1, 16, 0, "model.language_model.layers.4.self_attn.k_norm.weight");
    add_t(f, BERTH_DTYPE_F32, 2, 256, 64, "lm_head.weight"); /* tie_word_embeddings: true -> ignored */
    berth_model *m = NULL;
    ck_assert_msg(create_load(f, &m) == BERTH_OK, "load: %s", g_err);
    ck_assert_ptr_nonnull(strstr(g_log, "tie_word_embeddings is true; tensor 'lm_head.weight' is ignored"));
    VT()->destroy(m);
    ck_free(f);
}
END_TEST

START_TEST(load_rejects_missing_tensor)
{
    struct fake_ck *f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    remove_t(f, "model.layers.3.self_attn.q_proj.weight");
    load_fails(f, BERTH_E_NOT_FOUND, "tiny: missing tensor 'model.layers.3.self_attn.q_proj.weight'");

    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    remove_t(f, "model.layers.5.layer_scalar");
    load_fails(f, BERTH_E_NOT_FOUND, "tiny: missing tensor 'model.layers.5.layer_scalar'");
}
END_TEST

START_TEST(load_rejects_wrong_shape_dtype_unknown)
{
    struct fake_ck *f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    remove_t(f, "model.layers.2.self_attn.q_proj.weight"); /* full layer: [4*32, 64] */
    add_t(f, BERTH_DTYPE_F32, 2, 64, 64, "model.layers.2.self_attn.q_proj.weight");
    load_fails(f, BERTH_E_INVALID, "tiny/model-00001-of-00002.safetensors: tensor "
                                   "'model.layers.2.self_attn.q_proj.weight' has shape [64, 64], expected [128, 64]");

    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    remove_t(f, "model.layers.4.mlp.down_proj.weight"); /* double-wide: [64, 256] */
    add_t(f, BERTH_DTYPE_F32, 2, 64, 128, "model.layers.4.mlp.down_proj.weight");
    load_fails(f, BERTH_E_INVALID, "tiny/model-00002-of-00002.safetensors: tensor "
                                   "'model.layers.4.mlp.down_proj.weight' has shape [64, 128], expected [64, 256]");

    /* a host that does not say which shard (older than ABI 0.2): the directory is named instead */
    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    remove_t(f, "model.layers.4.mlp.down_proj.weight");
    add_t(f, BERTH_DTYPE_F32, 2, 64, 128, "model.layers.4.mlp.down_proj.weight");
    g_no_file = 1;
    load_fails(f, BERTH_E_INVALID,
               "tiny: tensor 'model.layers.4.mlp.down_proj.weight' has shape [64, 128], expected [64, 256]");
    g_no_file = 0;

    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    remove_t(f, "model.norm.weight");
    add_t(f, BERTH_DTYPE_I32, 1, 64, 0, "model.norm.weight");
    load_fails(f, BERTH_E_UNSUPPORTED, "tiny/model-00001-of-00002.safetensors: tensor 'model.norm.weight' has dtype "
                                       "i32, expected f32, bf16 or f16");

    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    add_t(f, BERTH_DTYPE_F32, 1, 64, 0, "model.layers.0.foo.weight");
    load_fails(f, BERTH_E_INVALID, "tiny: unknown tensor 'model.layers.0.foo.weight' (not part of the gemma4 text "
                                   "decoder)");

    /* k_proj on an owning layer is required; on layer 1 (owner) its absence is an error */
    f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    remove_t(f, "model.layers.1.self_attn.k_norm.weight");
    load_fails(f, BERTH_E_NOT_FOUND, "tiny: missing tensor 'model.layers.1.self_attn.k_norm.weight'");

    /* untied: lm_head.weight required */
    f = tiny_with("tie_word_embeddings", "false");
    tiny_tensors(f, "model.", BERTH_DTYPE_F32);
    load_fails(f, BERTH_E_NOT_FOUND, "tiny: missing tensor 'lm_head.weight'");
}
END_TEST

/* ------------------------------------------------------------------------------------------------------------
 * forward() wiring through the recording backend */

static int g_fake_mem;
static berth_tensor meta(berth_dtype dt, int64_t n0, int64_t n1)
{
    berth_tensor t;
    memset(&t, 0, sizeof t);
    t.buf = (berth_buffer *)&g_fake_mem;
    t.dtype = dt;
    t.ndim = n1 > 1 ? 2 : 1;
    t.ne[0] = n0;
    t.ne[1] = n1;
    t.ne[2] = t.ne[3] = 1;
    t.nb[0] = 4;
    t.nb[1] = 4 * n0;
    t.nb[2] = t.nb[3] = t.nb[1] * n1;
    return t;
}

START_TEST(forward_wiring)
{
    struct fake_ck *f = ck_new(TINY);
    tiny_tensors(f, "model.", BERTH_DTYPE_BF16);
    berth_model *m = NULL;
    ck_assert_msg(create_load(f, &m) == BERTH_OK, "load: %s", g_err);

    /* seq A: prefill 3 tokens at 0..2; seq B: one decode token at position 7. Logits for rows 2 and 3. */
    const int32_t tokens[4] = {2, 17, 200, 99}, pos[4] = {0, 1, 2, 7}, qs[3] = {0, 3, 4}, kvl[2] = {3, 8};
    const int32_t rows[2] = {2, 3};
    berth_kv_group_batch kv[2];
    memset(kv, 0, sizeof kv);
    const uint64_t base[2] = {1000, 2000}, stride[2] = {5000, 7000};
    for (int g = 0; g < 2; g++) {
        kv[g].pool.k_buf = kv[g].pool.v_buf = (berth_buffer *)&g_fake_mem;
        kv[g].pool.k_offset = base[g];
        kv[g].pool.v_offset = base[g] + 100;
        kv[g].pool.dtype = BERTH_DTYPE_F32;
        kv[g].pool.block_size = 16;
        kv[g].layer_stride = stride[g];
        kv[g].block_table = meta(BERTH_DTYPE_I32, 1, 2);
        kv[g].slots = meta(BERTH_DTYPE_I32, 4, 1);
        kv[g].slots.offset = 77 + (uint64_t)g; /* tells the groups' slot tensors apart */
    }
    berth_batch b;
    memset(&b, 0, sizeof b);
    b.struct_size = sizeof b;
    b.n_tokens = 4;
    b.n_seqs = 2;
    b.n_logits = 2;
    b.max_q_len = 3;
    b.max_kv_len = 8;
    b.tokens = meta(BERTH_DTYPE_I32, 4, 1);
    b.positions = meta(BERTH_DTYPE_I32, 4, 1);
    b.seq_q_start = meta(BERTH_DTYPE_I32, 3, 1);
    b.seq_kv_len = meta(BERTH_DTYPE_I32, 2, 1);
    b.logit_rows = meta(BERTH_DTYPE_I32, 2, 1);
    b.h_tokens = tokens;
    b.h_positions = pos;
    b.h_seq_q_start = qs;
    b.h_seq_kv_len = kvl;
    b.h_logit_rows = rows;
    b.n_kv_groups = 2;
    b.kv = kv;
    b.logits = meta(BERTH_DTYPE_F32, 256, 2);

    g_ncalls = g_n_x_pre = g_n_y_then = 0;
    ck_assert_msg(VT()->forward(m, NULL, &b) == BERTH_OK, "forward: %s", g_err);
    /* every post-norm but the last layer's last one came with the product that reads it: per layer the
     * post-attention norm (gate|up or up) and the post-FF norm (the PLE gate), and the post-PLE norm of five of
     * the six layers (the next layer's q|k|v or q); the PLE projection is the gate's second product (ABI 0.6) */
    ck_assert_int_eq(g_n_x_pre, 6 * 2 + 5);
    ck_assert_int_eq(g_n_y_then, 6);

    /* embedding first, scaled by sqrt(64) = 8 in fp32 */
    ck_assert_int_eq(g_calls[0].op, BERTH_OP_GET_ROWS);
    ck_assert(g_calls[0].p.gr.scale == 8.0f);
    ck_assert_int_eq(g_calls[0].p.gr.table.dtype, BERTH_DTYPE_BF16);
    ck_assert_int_eq(g_calls[0].p.gr.table.ne[1], 256);

    int n_att = 0, n_app = 0, n_mm = 0, n_scalar = 0, n_qrope = 0;
    const int win[6] = {8, 8, 0, 8, 8, 0};
    const uint64_t att_off[6] = {1000, 6000, 2000, 6000, 6000, 2000};
    const uint64_t app_off[3] = {1000, 6000, 2000};
    for (int i = 0; i < g_ncalls; i++) {
        const struct call *c = &g_calls[i];
        if (c->op == BERTH_OP_ATTENTION) {
            ck_assert_int_lt(n_att, 6);
            ck_assert_int_eq(c->p.at.window, win[n_att]);
            ck_assert_uint_eq(c->p.at.kv.k_offset, att_off[n_att]);
            ck_assert_uint_eq(c->p.at.kv.v_offset, att_off[n_att] + 100);
            ck_assert(c->p.at.scale == 1.0f);
            ck_assert_int_eq(c->p.at.mask, BERTH_MASK_CAUSAL);
            ck_assert_int_eq(c->p.at.n_seqs, 2);
            ck_assert_int_eq(c->p.at.q.ne[0], n_att == 2 || n_att == 5 ? 32 : 16);
            ck_assert_int_eq(c->p.at.q.ne[1], 4);
            ck_assert_int_eq(c->p.at.q.ne[2], 4);
            n_att++;
        } else if (c->op == BERTH_OP_KV_APPEND) {
            ck_assert_int_lt(n_app, 3);
            ck_assert_uint_eq(c->p.kv.kv.k_offset, app_off[n_app]);
            ck_assert_uint_eq(c->p.kv.slots.offset, n_app == 2 ? 78u : 77u);
            /* the V norm is weightless: mode UNIT and no weight tensor */
            ck_assert_int_eq(c->p.kv.v_norm_mode, BERTH_NORM_UNIT);
            /* q-norm + RoPE ride along (ABI 0.5): the layer's q heads, its q_norm weight */
            ck_assert_ptr_nonnull(c->p.kv.q.buf);
            ck_assert_int_eq(c->p.kv.q_norm_mode, BERTH_NORM_W);
            ck_assert_ptr_nonnull(c->p.kv.q_norm.buf);
            ck_assert_int_eq(c->p.kv.q.ne[0], n_app == 2 ? 32 : 16);
            ck_assert_int_eq(c->p.kv.q.ne[1], 4);
            ck_assert_ptr_null(c->p.kv.v_norm.buf);
            /* RoPE table of the layer type, pairs and offset per §3.4 */
            const int full = n_app == 2;
            ck_assert_int_eq(c->p.kv.rope_n_pairs, full ? 4 : 8);
            ck_assert_int_eq(c->p.kv.rope_pair_offset, full ? 16 : 8);
            const struct fake_buf *rb = (const struct fake_buf *)c->p.kv.rope_freqs.buf;
            float f1;
            memcpy(&f1, rb->mem + c->p.kv.rope_freqs.offset + 4, 4);
            ck_assert_double_eq_tol(f1, full ? pow(1e6, -2.0 / 32) : pow(1e4, -2.0 / 16), 1e-6);
            n_app++;
        } else if (c->op == BERTH_OP_MATMUL) {
            n_mm++;
        } else if (c->op == BERTH_OP_RMS_NORM && c->p.rn.out_scale != 0.0f && c->p.rn.x.ne[0] == 64) {
            /* layer_scalar of layer n_scalar: the out_scale of its last norm (PLE's, added to the residual) */
            ck_assert_int_eq(c->p.rn.resid_mode, BERTH_RESID_ADD_AFTER);
            ck_assert(c->p.rn.out_scale == SCALAR[n_scalar]);
            n_scalar++;
        } else if (c->op == BERTH_OP_UNARY && c->p.un.act == BERTH_ACT_IDENTITY && c->p.un.x.ne[0] == 64) {
            ck_abort_msg("a separate scale of the hidden state (layer_scalar is a norm's out_scale)");
        } else if (c->op == BERTH_OP_RMS_NORM && c->p.rn.rope_n_pairs > 0) {
            /* q_norm + RoPE in one op: the batch's positions, the layer type's table */
            ck_assert_ptr_eq(c->p.rn.rope_positions.buf, b.positions.buf);
            ck_assert_int_eq(c->p.rn.rope_n_pairs, c->p.rn.x.ne[0] == 32 ? 4 : 8);
            n_qrope++;
        } else if (c->op == BERTH_OP_ROPE || c->op == BERTH_OP_GLU) {
            ck_abort_msg("op %d should be fused", c->op);
        }
    }
    ck_assert_int_eq(n_att, 6);
    ck_assert_int_eq(n_app, 3);
    /* 3 owners x (q,k,v,o,gate,up,down,ple gate,ple proj) + 3 shared x 7 + PLE model projection + LM head */
    ck_assert_int_eq(n_mm, 3 * 9 + 3 * 7 + 2);
    ck_assert_int_eq(n_scalar, 6); /* every layer: 1.0 (layer 5) is an exact no-op for the backend */
    ck_assert_int_eq(n_qrope, 3); /* the KV-sharing layers' q: the other three ride in kv_append */

    /* tail: gather rows 2,3 -> final norm -> tied head (embed_tokens) into logits -> softcap c = 1 */
    const struct call *last = &g_calls[g_ncalls - 1], *mm = &g_calls[g_ncalls - 2];
    const struct call *nrm = &g_calls[g_ncalls - 3], *gat = &g_calls[g_ncalls - 4];
    ck_assert_int_eq(gat->op, BERTH_OP_GET_ROWS);
    ck_assert_int_eq(gat->p.gr.y.ne[1], 2);
    ck_assert_int_eq(gat->p.gr.table.dtype, BERTH_DTYPE_F32);
    ck_assert_int_eq(nrm->op, BERTH_OP_RMS_NORM);
    ck_assert_int_eq(mm->op, BERTH_OP_MATMUL);
    ck_assert_int_eq(mm->p.mm.w.ne[1], 256);
    ck_assert_ptr_eq(mm->p.mm.y.buf, b.logits.buf);
    ck_assert_int_eq(mm->p.mm.y.ne[1], 2);
    ck_assert_int_eq(last->op, BERTH_OP_UNARY);
    ck_assert_int_eq(last->p.un.act, BERTH_ACT_TANH);
    ck_assert(last->p.un.in_scale == 1.0f && last->p.un.out_scale == 1.0f);

    berth_counter cs[8];
    int32_t nc = 0;
    ck_assert_int_eq(VT()->counters(m, cs, 8, &nc), BERTH_OK);
    ck_assert_int_eq(nc, 4);
    for (int i = 0; i < nc; i++) {
        if (strcmp(cs[i].name, "prefill_tokens") == 0)
            ck_assert_int_eq(cs[i].value, 3);
        else if (strcmp(cs[i].name, "decode_steps") == 0)
            ck_assert_int_eq(cs[i].value, 1);
        else if (strcmp(cs[i].name, "forward_calls") == 0)
            ck_assert_int_eq(cs[i].value, 1);
    }

    /* the PLE projection's D^-1/2 scale rides in its norm's eps (no pass of its own): eps * 64 */
    int n_ple_norm = 0;
    for (int i = 0; i < g_ncalls; i++) {
        const struct call *c = &g_calls[i];
        if (c->op == BERTH_OP_UNARY && c->p.un.x.ne[0] == 6 * 8)
            ck_abort_msg("a separate scale of the PLE projection");
        if (c->op == BERTH_OP_RMS_NORM && c->p.rn.x.ne[0] == 8 && c->p.rn.resid_mode == BERTH_RESID_ADD_AFTER &&
            c->p.rn.out_scale == (float)pow(2.0, -0.5)) {
            ck_assert_float_eq(c->p.rn.eps, (float)(1e-6 * 64));
            n_ple_norm++;
        }
    }
    ck_assert_int_eq(n_ple_norm, 1);

    /* logit rows must be ascending and distinct (head() relies on it): refused before any op runs */
    const int32_t rows_down[2] = {3, 2}, rows_same[2] = {3, 3};
    b.h_logit_rows = rows_down;
    g_ncalls = 0;
    ck_assert_int_eq(VT()->forward(m, NULL, &b), BERTH_E_INVALID);
    ck_assert_str_eq(g_err, "gemma4: logit rows must be ascending and distinct: row 1 names token 2 after token 3");
    b.h_logit_rows = rows_same;
    ck_assert_int_eq(VT()->forward(m, NULL, &b), BERTH_E_INVALID);
    ck_assert_str_eq(g_err, "gemma4: logit rows must be ascending and distinct: row 1 names token 3 after token 3");
    ck_assert_int_eq(g_ncalls, 0);
    b.h_logit_rows = rows;

    /* every token a logit row (a decode step): no gather, the final norm reads the residual stream itself */
    const int32_t d_tokens[2] = {17, 99}, d_pos[2] = {3, 7}, d_qs[3] = {0, 1, 2}, d_kvl[2] = {4, 8}, d_rows[2] = {0, 1};
    berth_batch d = b;
    d.n_tokens = 2;
    d.max_q_len = 1;
    d.tokens = meta(BERTH_DTYPE_I32, 2, 1);
    d.positions = meta(BERTH_DTYPE_I32, 2, 1);
    d.h_tokens = d_tokens;
    d.h_positions = d_pos;
    d.h_seq_q_start = d_qs;
    d.h_seq_kv_len = d_kvl;
    d.h_logit_rows = d_rows;
    for (int g = 0; g < 2; g++)
        kv[g].slots = meta(BERTH_DTYPE_I32, 2, 1);
    g_ncalls = 0;
    ck_assert_msg(VT()->forward(m, NULL, &d) == BERTH_OK, "forward (decode): %s", g_err);
    const struct call *dn = &g_calls[g_ncalls - 3], *dprev = &g_calls[g_ncalls - 4];
    ck_assert_int_eq(dn->op, BERTH_OP_RMS_NORM);
    ck_assert_int_eq(dn->p.rn.x.ne[1], 2);
    ck_assert_int_ne(dprev->op, BERTH_OP_GET_ROWS);
    ck_assert_int_eq(g_calls[g_ncalls - 2].op, BERTH_OP_MATMUL);
    ck_assert_int_eq(g_calls[g_ncalls - 1].op, BERTH_OP_UNARY);
    for (int i = 0; i < g_ncalls; i++)
        ck_assert_msg(g_calls[i].op != BERTH_OP_GET_ROWS || g_calls[i].p.gr.table.dtype != BERTH_DTYPE_F32,
                      "call %d gathers f32 rows (the logit rows) in a decode step", i);

    /* bad token id: refused before any op runs */
    const int32_t bad[4] = {2, 300, 5, 6};
    b.h_tokens = bad;
    g_ncalls = 0;
    ck_assert_int_eq(VT()->forward(m, NULL, &b), BERTH_E_INVALID);
    ck_assert_str_eq(g_err, "gemma4: token id 300 at batch row 1 is outside the vocabulary (256)");
    ck_assert_int_eq(g_ncalls, 0);

    VT()->destroy(m);
    ck_free(f);
}
END_TEST

static Suite *gemma4_suite(void)
{
    Suite *s = suite_create("gemma4_config");
    TCase *tc = tcase_create("resolution");
    tcase_add_test(tc, tiny_per_layer_config);
    tcase_add_test(tc, e2b_official_form);
    tcase_add_test(tc, global_head_dim_absent_is_512);
    tcase_add_test(tc, global_kv_heads_only_with_k_eq_v);
    tcase_add_test(tc, zero_padded_keys);
    tcase_add_test(tc, last_layer_forced_full);
    tcase_add_test(tc, eos_list_and_defaults);
    tcase_add_test(tc, rope_tables);
    suite_add_tcase(s, tc);
    tc = tcase_create("rejections");
    tcase_add_test(tc, reject_unsupported_features);
    tcase_add_test(tc, reject_illegal_geometry);
    tcase_add_test(tc, reject_per_layer_config);
    tcase_add_test(tc, reject_bad_values);
    suite_add_tcase(s, tc);
    tc = tcase_create("plugin");
    tcase_add_test(tc, descriptor_and_accept);
    tcase_add_test(tc, create_info_layout_requirements);
    tcase_add_test(tc, load_binds_spec_tensor_set);
    tcase_add_test(tc, load_tolerates_ignorable_and_foreign_tensors);
    tcase_add_test(tc, load_rejects_missing_tensor);
    tcase_add_test(tc, load_rejects_wrong_shape_dtype_unknown);
    tcase_add_test(tc, forward_wiring);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(gemma4_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

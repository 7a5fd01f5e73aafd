/*
 * gemma4_config.c — config.json -> struct g4_config (spec gemma4.md §1.2, §1.3, §3.4, §3.6, §6).
 *
 * Values are read through the host's BERTH_SVC_CHECKPOINT services, relative to key_base ("" for gemma4_text,
 * "text_config" for the multimodal gemma4 file). A JSON null means "use the default" only for keys where HF
 * treats None that way (listed at each read); elsewhere it is rejected. Booleans read null as false, as Python's
 * truthiness does.
 */
#include "gemma4_config.h"

#include "gemma4_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define G4_PATH_MAX 160

enum { NULL_IS_DEFAULT = 0, NULL_REJECTED = 1 };

/* Where keys are read from. */
struct rd {
    const berth_host *host;
    const berth_checkpoint *ck;
    const char *base;
};

static const char *const type_names[G4_N_TYPES] = {"sliding_attention", "full_attention"};

const char *g4_type_name(int type)
{
    return type == G4_FULL ? type_names[G4_FULL] : type_names[G4_SLIDING];
}

static const char *kind_name(int32_t kind)
{
    switch (kind) {
    case BERTH_JSON_MISSING: return "nothing";
    case BERTH_JSON_NULL: return "null";
    case BERTH_JSON_BOOL: return "a boolean";
    case BERTH_JSON_INT: return "an integer";
    case BERTH_JSON_REAL: return "a real number";
    case BERTH_JSON_STRING: return "a string";
    case BERTH_JSON_ARRAY: return "an array";
    case BERTH_JSON_OBJECT: return "an object";
    default: return "an unknown JSON value";
    }
}

static void rd_path(const struct rd *r, const char *key, char *out)
{
    if (r->base[0] && key[0])
        snprintf(out, G4_PATH_MAX, "%s.%s", r->base, key);
    else
        snprintf(out, G4_PATH_MAX, "%s", r->base[0] ? r->base : key);
}

static int32_t rd_kind(const struct rd *r, const char *key)
{
    char p[G4_PATH_MAX];
    rd_path(r, key, p);
    return r->host->ckpt_cfg_type(r->host->ctx, r->ck, p);
}

static berth_status wrong_kind(const struct rd *r, const char *key, const char *want, int32_t got)
{
    char p[G4_PATH_MAX];
    rd_path(r, key, p);
    return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s must be %s, got %s", p, want, kind_name(got));
}

/* Integer key in [lo, hi]; missing (and null when null_mode says so) gives def. */
static berth_status rd_int(const struct rd *r, const char *key, int64_t def, int64_t lo, int64_t hi, int null_mode,
                           int64_t *out)
{
    char p[G4_PATH_MAX];
    int64_t v;
    int32_t kind = rd_kind(r, key);
    if (kind == BERTH_JSON_MISSING || (kind == BERTH_JSON_NULL && null_mode == NULL_IS_DEFAULT)) {
        *out = def;
        return BERTH_OK;
    }
    if (kind != BERTH_JSON_INT)
        return wrong_kind(r, key, "an integer", kind);
    rd_path(r, key, p);
    berth_status st = r->host->ckpt_cfg_int(r->host->ctx, r->ck, p, &v);
    if (st != BERTH_OK)
        return st;
    if (v < lo || v > hi)
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %" PRId64 " is out of range [%" PRId64
                       ", %" PRId64 "]", p, v, lo, hi);
    *out = v;
    return BERTH_OK;
}

/* Same for an int-typed destination. */
static berth_status rd_int32(const struct rd *r, const char *key, int64_t def, int64_t lo, int64_t hi,
                             int null_mode, int *out)
{
    int64_t v = def; /* rd_int sets it on success; initialised for gcc's -Wmaybe-uninitialized at -O2 */
    berth_status st = rd_int(r, key, def, lo, hi, null_mode, &v);
    if (st == BERTH_OK)
        *out = (int)v;
    return st;
}

/* Real (or integer) key; *present = 0 when missing or null (then *out = def). */
static berth_status rd_real(const struct rd *r, const char *key, double def, double *out, int *present)
{
    char p[G4_PATH_MAX];
    int32_t kind = rd_kind(r, key);
    *present = 0;
    *out = def;
    if (kind == BERTH_JSON_MISSING || kind == BERTH_JSON_NULL)
        return BERTH_OK;
    if (kind != BERTH_JSON_INT && kind != BERTH_JSON_REAL)
        return wrong_kind(r, key, "a number", kind);
    rd_path(r, key, p);
    berth_status st = r->host->ckpt_cfg_real(r->host->ctx, r->ck, p, out);
    if (st == BERTH_OK)
        *present = 1;
    return st;
}

/* Boolean key: missing gives def, null gives false. */
static berth_status rd_bool(const struct rd *r, const char *key, int def, int *out)
{
    char p[G4_PATH_MAX];
    int32_t v = 0;
    int32_t kind = rd_kind(r, key);
    if (kind == BERTH_JSON_MISSING) {
        *out = def;
        return BERTH_OK;
    }
    if (kind == BERTH_JSON_NULL) {
        *out = 0;
        return BERTH_OK;
    }
    if (kind != BERTH_JSON_BOOL)
        return wrong_kind(r, key, "true or false", kind);
    rd_path(r, key, p);
    berth_status st = r->host->ckpt_cfg_bool(r->host->ctx, r->ck, p, &v);
    if (st == BERTH_OK)
        *out = v != 0;
    return st;
}

/* String key; *out = NULL when missing or null. */
static berth_status rd_string(const struct rd *r, const char *key, const char **out)
{
    char p[G4_PATH_MAX];
    int32_t kind = rd_kind(r, key);
    *out = NULL;
    if (kind == BERTH_JSON_MISSING || kind == BERTH_JSON_NULL)
        return BERTH_OK;
    if (kind != BERTH_JSON_STRING)
        return wrong_kind(r, key, "a string", kind);
    rd_path(r, key, p);
    return r->host->ckpt_cfg_string(r->host->ctx, r->ck, p, out);
}

berth_status g4_config_model_type(const berth_host *host, const berth_checkpoint *ck, int *multimodal)
{
    const char *mt = NULL;
    if (host->ckpt_cfg_type(host->ctx, ck, "model_type") != BERTH_JSON_STRING ||
        host->ckpt_cfg_string(host->ctx, ck, "model_type", &mt) != BERTH_OK || !mt)
        return g4_fail(host, BERTH_E_UNSUPPORTED,
                       "config.json has no model_type string; gemma4 handles gemma4_text, gemma4");
    if (strcmp(mt, "gemma4_text") == 0) {
        *multimodal = 0;
        return BERTH_OK;
    }
    if (strcmp(mt, "gemma4") == 0) {
        *multimodal = 1;
        return BERTH_OK;
    }
    return g4_fail(host, BERTH_E_UNSUPPORTED, "model_type '%s' is not handled by gemma4 (handles gemma4_text, gemma4)",
                   mt);
}

/* --- layer types ------------------------------------------------------------------------------------------- */

static berth_status parse_layer_types(const struct rd *r, struct g4_config *c)
{
    char p[G4_PATH_MAX];
    int32_t kind = rd_kind(r, "layer_types");
    const int L = c->n_layers;
    if (kind == BERTH_JSON_MISSING || kind == BERTH_JSON_NULL) {
        for (int i = 0; i < L; i++) /* HF default: every sixth layer is full */
            c->layers[i].type = (i + 1) % 6 == 0 ? G4_FULL : G4_SLIDING;
    } else if (kind != BERTH_JSON_ARRAY) {
        return wrong_kind(r, "layer_types", "an array", kind);
    } else {
        int64_t n = 0;
        rd_path(r, "layer_types", p);
        berth_status st = r->host->ckpt_cfg_len(r->host->ctx, r->ck, p, &n);
        if (st != BERTH_OK)
            return st;
        if (n != L)
            return g4_fail(r->host, BERTH_E_INVALID,
                           "config.json: %s has %" PRId64 " entries, expected num_hidden_layers = %d", p, n, L);
        for (int i = 0; i < L; i++) {
            char key[48];
            const char *s = NULL;
            snprintf(key, sizeof key, "layer_types.%d", i);
            st = rd_string(r, key, &s);
            if (st != BERTH_OK)
                return st;
            if (s && strcmp(s, type_names[G4_SLIDING]) == 0)
                c->layers[i].type = G4_SLIDING;
            else if (s && strcmp(s, type_names[G4_FULL]) == 0)
                c->layers[i].type = G4_FULL;
            else
                return g4_fail(r->host, BERTH_E_INVALID,
                               "config.json: %s.%d = '%s' is not a layer type (sliding_attention, full_attention)",
                               p, i, s ? s : "null");
        }
    }
    if (c->layers[L - 1].type != G4_FULL) {
        /* HF rewrites the last entry to full attention without a word; mirror it, but say so. */
        g4_log(r->host, BERTH_LOG_WARN,
               "config.json: layer_types[%d] is sliding_attention; the last layer always uses full attention "
               "(as transformers rewrites it)", L - 1);
        c->layers[L - 1].type = G4_FULL;
    }
    return BERTH_OK;
}

/* --- RoPE -------------------------------------------------------------------------------------------------- */

static void rope_default(struct g4_rope *ro, int type)
{
    ro->proportional = type == G4_FULL;
    ro->theta = type == G4_FULL ? 1000000.0 : 10000.0;
    ro->partial_rotary_factor = type == G4_FULL ? 0.25 : 1.0;
    ro->factor = 1.0;
}

static berth_status parse_rope_type(const struct rd *r, int type, struct g4_rope *ro)
{
    char key[96], p[G4_PATH_MAX];
    const char *rt = NULL;
    int present = 0;
    berth_status st;

    snprintf(key, sizeof key, "rope_parameters.%s", type_names[type]);
    int32_t kind = rd_kind(r, key);
    rd_path(r, key, p);
    if (kind == BERTH_JSON_MISSING || kind == BERTH_JSON_NULL)
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s is missing but layer_types uses %s", p,
                       type_names[type]);
    if (kind != BERTH_JSON_OBJECT)
        return wrong_kind(r, key, "an object", kind);

    snprintf(key, sizeof key, "rope_parameters.%s.rope_type", type_names[type]);
    if ((st = rd_string(r, key, &rt)) != BERTH_OK)
        return st;
    if (!rt || strcmp(rt, "default") == 0) {
        ro->proportional = 0;
    } else if (strcmp(rt, "proportional") == 0) {
        ro->proportional = 1;
    } else {
        rd_path(r, key, p);
        return g4_fail(r->host, BERTH_E_UNSUPPORTED,
                       "config.json: %s = '%s' is not supported (gemma4 handles default, proportional)", p, rt);
    }

    struct g4_rope def;
    rope_default(&def, type);
    snprintf(key, sizeof key, "rope_parameters.%s.rope_theta", type_names[type]);
    if ((st = rd_real(r, key, def.theta, &ro->theta, &present)) != BERTH_OK)
        return st;
    if (!(ro->theta > 1.0)) {
        rd_path(r, key, p);
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %g must be greater than 1", p, ro->theta);
    }
    ro->partial_rotary_factor = 1.0;
    ro->factor = 1.0;
    if (!ro->proportional) /* default RoPE ignores both (spec §3.4) */
        return BERTH_OK;
    snprintf(key, sizeof key, "rope_parameters.%s.partial_rotary_factor", type_names[type]);
    if ((st = rd_real(r, key, 1.0, &ro->partial_rotary_factor, &present)) != BERTH_OK)
        return st;
    if (!(ro->partial_rotary_factor > 0.0 && ro->partial_rotary_factor <= 1.0)) {
        rd_path(r, key, p);
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %g is out of range (0, 1]", p,
                       ro->partial_rotary_factor);
    }
    snprintf(key, sizeof key, "rope_parameters.%s.factor", type_names[type]);
    if ((st = rd_real(r, key, 1.0, &ro->factor, &present)) != BERTH_OK)
        return st;
    if (!(ro->factor > 0.0)) {
        rd_path(r, key, p);
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %g must be positive", p, ro->factor);
    }
    return BERTH_OK;
}

static berth_status parse_rope(const struct rd *r, struct g4_config *c)
{
    int32_t kind = rd_kind(r, "rope_parameters");
    for (int t = 0; t < G4_N_TYPES; t++)
        rope_default(&c->rope[t], t);
    if (kind == BERTH_JSON_MISSING || kind == BERTH_JSON_NULL)
        return BERTH_OK;
    if (kind != BERTH_JSON_OBJECT)
        return wrong_kind(r, "rope_parameters", "an object", kind);
    /* Other members (e.g. a stray rope_theta) are ignored, as HF does. */
    for (int t = 0; t < G4_N_TYPES; t++) {
        if (!c->type_used[t])
            continue;
        berth_status st = parse_rope_type(r, t, &c->rope[t]);
        if (st != BERTH_OK)
            return st;
    }
    return BERTH_OK;
}

/* --- head dims and KV heads (§1.3) ------------------------------------------------------------------------- */

#define G4_HD_MAX 65536
#define G4_HEADS_MAX 4096

/* Overrides of one layer from per_layer_config; -1 = not given. */
struct g4_override {
    int head_dim;
    int n_kv_heads;
    int given; /* the layer has an entry */
    char key[24];
};

static int is_layer_key(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 9)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static berth_status parse_per_layer_config(const struct rd *r, const struct g4_config *c, struct g4_override *ov)
{
    char p[G4_PATH_MAX], key[64];
    int64_t n = 0;
    berth_status st;
    rd_path(r, "per_layer_config", p);
    if ((st = r->host->ckpt_cfg_len(r->host->ctx, r->ck, p, &n)) != BERTH_OK)
        return st;
    for (int64_t k = 0; k < n; k++) {
        const char *lk = NULL;
        if ((st = r->host->ckpt_cfg_key(r->host->ctx, r->ck, p, k, &lk)) != BERTH_OK)
            return st;
        if (!is_layer_key(lk))
            return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s key '%s' is not a layer index", p, lk);
        long idx = strtol(lk, NULL, 10); /* keys are zero-padded decimal ("05") */
        if (idx >= c->n_layers)
            return g4_fail(r->host, BERTH_E_INVALID,
                           "config.json: %s key '%s' is not a layer index (num_hidden_layers = %d)", p, lk,
                           c->n_layers);
        struct g4_override *o = &ov[idx];
        if (o->given)
            return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s has both '%s' and '%s' for layer %ld", p,
                           o->key, lk, idx);
        o->given = 1;
        snprintf(o->key, sizeof o->key, "%s", lk);

        snprintf(key, sizeof key, "per_layer_config.%s", lk);
        int32_t kind = rd_kind(r, key);
        if (kind != BERTH_JSON_OBJECT)
            return wrong_kind(r, key, "an object", kind);
        char op[G4_PATH_MAX];
        int64_t m = 0;
        rd_path(r, key, op);
        if ((st = r->host->ckpt_cfg_len(r->host->ctx, r->ck, op, &m)) != BERTH_OK)
            return st;
        for (int64_t j = 0; j < m; j++) {
            const char *name = NULL;
            if ((st = r->host->ckpt_cfg_key(r->host->ctx, r->ck, op, j, &name)) != BERTH_OK)
                return st;
            char vk[96];
            snprintf(vk, sizeof vk, "per_layer_config.%s.%s", lk, name);
            if (strcmp(name, "head_dim") == 0)
                st = rd_int32(r, vk, -1, 2, G4_HD_MAX, NULL_IS_DEFAULT, &o->head_dim);
            else if (strcmp(name, "num_key_value_heads") == 0)
                st = rd_int32(r, vk, -1, 1, G4_HEADS_MAX, NULL_IS_DEFAULT, &o->n_kv_heads);
            else
                return g4_fail(r->host, BERTH_E_UNSUPPORTED,
                               "config.json: %s overrides '%s'; gemma4 only handles head_dim and "
                               "num_key_value_heads overrides", op, name);
            if (st != BERTH_OK)
                return st;
        }
    }
    return BERTH_OK;
}

/* Resolve hd/K per type; hd_src and kv_src name the key each came from (for messages). */
static berth_status resolve_heads(const struct rd *r, struct g4_config *c, int head_dim, int n_kv,
                                  char hd_src[G4_N_TYPES][G4_PATH_MAX], char kv_src[G4_N_TYPES][G4_PATH_MAX])
{
    char p[G4_PATH_MAX];
    berth_status st;
    int32_t kind = rd_kind(r, "per_layer_config");

    if (kind == BERTH_JSON_OBJECT) {
        struct g4_override *ov = calloc((size_t)c->n_layers, sizeof *ov);
        if (!ov)
            return g4_fail(r->host, BERTH_E_NOMEM, "out of memory reading per_layer_config");
        for (int i = 0; i < c->n_layers; i++)
            ov[i].head_dim = ov[i].n_kv_heads = -1;
        st = parse_per_layer_config(r, c, ov);
        int first[G4_N_TYPES] = {-1, -1};
        for (int i = 0; st == BERTH_OK && i < c->n_layers; i++) {
            int t = c->layers[i].type;
            if (first[t] < 0) {
                first[t] = i;
                const struct g4_override *o = &ov[i];
                char key[64];
                c->type_head_dim[t] = o->head_dim >= 0 ? o->head_dim : head_dim;
                c->type_kv_heads[t] = o->n_kv_heads >= 0 ? o->n_kv_heads : n_kv;
                snprintf(key, sizeof key, "per_layer_config.%s.head_dim", o->key);
                rd_path(r, o->head_dim >= 0 ? key : "head_dim", hd_src[t]);
                snprintf(key, sizeof key, "per_layer_config.%s.num_key_value_heads", o->key);
                rd_path(r, o->n_kv_heads >= 0 ? key : "num_key_value_heads", kv_src[t]);
                continue;
            }
            /* HF builds one attention geometry and RoPE table per type: overrides must agree within a type. */
            const struct g4_override *a = &ov[first[t]], *b = &ov[i];
            if (a->head_dim != b->head_dim || a->n_kv_heads != b->n_kv_heads) {
                rd_path(r, "per_layer_config", p);
                st = g4_fail(r->host, BERTH_E_INVALID,
                             "config.json: %s gives layer %d (%s) other overrides than layer %d (head_dim %d vs %d, "
                             "num_key_value_heads %d vs %d; -1 = not overridden); all layers of one type must match",
                             p, i, type_names[t], first[t], b->head_dim, a->head_dim, b->n_kv_heads,
                             a->n_kv_heads);
            }
        }
        free(ov);
        return st;
    }
    if (kind != BERTH_JSON_MISSING && kind != BERTH_JSON_NULL)
        return wrong_kind(r, "per_layer_config", "an object", kind);

    /* Official config form: global_head_dim / num_global_key_value_heads (popped kwargs in HF). */
    int global_hd = 0, global_kv = 0;
    if ((st = rd_int32(r, "global_head_dim", 512, 2, G4_HD_MAX, NULL_IS_DEFAULT, &global_hd)) != BERTH_OK)
        return st;
    if ((st = rd_int32(r, "num_global_key_value_heads", -1, 1, G4_HEADS_MAX, NULL_IS_DEFAULT, &global_kv)) !=
        BERTH_OK)
        return st;
    c->type_head_dim[G4_SLIDING] = head_dim;
    c->type_kv_heads[G4_SLIDING] = n_kv;
    rd_path(r, "head_dim", hd_src[G4_SLIDING]);
    rd_path(r, "num_key_value_heads", kv_src[G4_SLIDING]);
    c->type_head_dim[G4_FULL] = global_hd;
    if (rd_kind(r, "global_head_dim") == BERTH_JSON_INT)
        rd_path(r, "global_head_dim", hd_src[G4_FULL]);
    else
        snprintf(hd_src[G4_FULL], G4_PATH_MAX, "global_head_dim (absent, default)");
    if (c->k_eq_v && global_kv > 0) {
        c->type_kv_heads[G4_FULL] = global_kv;
        rd_path(r, "num_global_key_value_heads", kv_src[G4_FULL]);
    } else { /* num_global_key_value_heads only counts with attention_k_eq_v */
        c->type_kv_heads[G4_FULL] = n_kv;
        rd_path(r, "num_key_value_heads", kv_src[G4_FULL]);
    }
    return BERTH_OK;
}

/* --- token ids --------------------------------------------------------------------------------------------- */

static berth_status add_eos(const struct rd *r, struct g4_config *c, const char *key, int64_t id)
{
    char p[G4_PATH_MAX];
    if (id < 0 || id > INT32_MAX) {
        rd_path(r, key, p);
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %" PRId64 " is not a token id", p, id);
    }
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return BERTH_OK;
    if (c->n_eos == G4_MAX_EOS) {
        g4_log(r->host, BERTH_LOG_WARN, "config.json: more than %d eos_token_id values; id %" PRId64 " ignored",
               G4_MAX_EOS, id);
        return BERTH_OK;
    }
    c->eos_ids[c->n_eos++] = (int)id;
    return BERTH_OK;
}

/* eos_token_id at one level: int, list of ints or null. *found = 0 when the key is missing. */
static berth_status read_eos(const struct rd *r, struct g4_config *c, int *found)
{
    char p[G4_PATH_MAX], key[48];
    int64_t v = 0, n = 0;
    berth_status st;
    int32_t kind = rd_kind(r, "eos_token_id");
    *found = kind != BERTH_JSON_MISSING;
    if (kind == BERTH_JSON_MISSING || kind == BERTH_JSON_NULL)
        return BERTH_OK;
    if (kind == BERTH_JSON_INT) {
        if ((st = rd_int(r, "eos_token_id", 0, INT64_MIN, INT64_MAX, NULL_REJECTED, &v)) != BERTH_OK)
            return st;
        return add_eos(r, c, "eos_token_id", v);
    }
    if (kind != BERTH_JSON_ARRAY)
        return wrong_kind(r, "eos_token_id", "an integer or a list of integers", kind);
    rd_path(r, "eos_token_id", p);
    if ((st = r->host->ckpt_cfg_len(r->host->ctx, r->ck, p, &n)) != BERTH_OK)
        return st;
    for (int64_t i = 0; i < n; i++) {
        snprintf(key, sizeof key, "eos_token_id.%" PRId64, i);
        if ((st = rd_int(r, key, 0, INT64_MIN, INT64_MAX, NULL_REJECTED, &v)) != BERTH_OK)
            return st;
        if ((st = add_eos(r, c, key, v)) != BERTH_OK)
            return st;
    }
    return BERTH_OK;
}

/* bos/eos live in text_config and/or at the top level of a multimodal file: bos from the text config first;
 * eos is the union of both levels (the top level of official -it files lists the turn-end id too). */
static berth_status parse_token_ids(const struct rd *r, const struct rd *top, struct g4_config *c)
{
    berth_status st;
    int found_text = 0, found_top = 0;
    const struct rd *bos_rd = r;
    if (r != top && rd_kind(r, "bos_token_id") == BERTH_JSON_MISSING)
        bos_rd = top;
    int64_t bos = 2;
    int32_t kind = rd_kind(bos_rd, "bos_token_id");
    if (kind == BERTH_JSON_NULL)
        bos = -1;
    else if ((st = rd_int(bos_rd, "bos_token_id", 2, 0, INT32_MAX, NULL_REJECTED, &bos)) != BERTH_OK)
        return st;
    c->bos_id = (int)bos;

    if ((st = read_eos(r, c, &found_text)) != BERTH_OK)
        return st;
    if (r != top && (st = read_eos(top, c, &found_top)) != BERTH_OK)
        return st;
    if (!found_text && !found_top)
        c->eos_ids[c->n_eos++] = 1; /* Gemma4TextConfig default */
    return BERTH_OK;
}

/* --- legality (§6) and layer wiring (§3.6) ----------------------------------------------------------------- */

static berth_status check_and_wire(const struct rd *r, struct g4_config *c, char hd_src[G4_N_TYPES][G4_PATH_MAX],
                                   char kv_src[G4_N_TYPES][G4_PATH_MAX])
{
    char p[G4_PATH_MAX];
    for (int t = 0; t < G4_N_TYPES; t++) {
        if (!c->type_used[t])
            continue;
        int hd = c->type_head_dim[t], kv = c->type_kv_heads[t];
        if (hd % 2 != 0)
            return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %d is odd; head dims must be even (%s layers)",
                           hd_src[t], hd, type_names[t]);
        if (c->n_heads % kv != 0) {
            rd_path(r, "num_attention_heads", p);
            return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %d is not divisible by %s = %d (%s layers)",
                           p, c->n_heads, kv_src[t], kv, type_names[t]);
        }
    }
    if (c->type_used[G4_SLIDING] && c->window < 2) {
        rd_path(r, "sliding_window", p);
        return g4_fail(r->host, BERTH_E_INVALID,
                       "config.json: %s = %d is too small; sliding layers need a window of at least 2", p, c->window);
    }
    if (c->n_kv_shared >= c->n_layers) {
        rd_path(r, "num_kv_shared_layers", p);
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %d must be less than num_hidden_layers = %d", p,
                       c->n_kv_shared, c->n_layers);
    }
    c->first_shared = c->n_layers - c->n_kv_shared;

    int last_owner[G4_N_TYPES] = {-1, -1};
    int owners[G4_N_TYPES] = {0, 0};
    for (int i = 0; i < c->first_shared; i++) {
        struct g4_layer *ly = &c->layers[i];
        last_owner[ly->type] = i;
        ly->kv_index = owners[ly->type]++;
    }
    /* Groups: sliding first, then full; only types that store a cache. */
    int group_of[G4_N_TYPES] = {-1, -1};
    c->n_kv_groups = 0;
    for (int t = 0; t < G4_N_TYPES; t++) {
        if (owners[t] == 0)
            continue;
        group_of[t] = c->n_kv_groups;
        c->group_type[c->n_kv_groups] = t;
        c->group_layers[c->n_kv_groups] = owners[t];
        c->n_kv_groups++;
    }
    for (int i = 0; i < c->n_layers; i++) {
        struct g4_layer *ly = &c->layers[i];
        int t = ly->type;
        ly->head_dim = c->type_head_dim[t];
        ly->n_kv_heads = c->type_kv_heads[t];
        ly->kv_shared = i >= c->first_shared;
        ly->v_from_k = c->k_eq_v && t == G4_FULL;
        ly->mlp_width = c->intermediate;
        if (!ly->kv_shared) {
            ly->kv_src = i;
        } else {
            if (last_owner[t] < 0) {
                rd_path(r, "num_kv_shared_layers", p);
                return g4_fail(r->host, BERTH_E_INVALID,
                               "config.json: KV-shared layer %d (%s) has no earlier non-shared %s layer to read from "
                               "(%s = %d leaves layers 0..%d)", i, type_names[t], type_names[t], p, c->n_kv_shared,
                               c->first_shared - 1);
            }
            ly->kv_src = last_owner[t];
            ly->kv_index = c->layers[ly->kv_src].kv_index;
            if (c->double_wide_mlp && c->first_shared > 0)
                ly->mlp_width = 2 * c->intermediate;
        }
        ly->kv_group = group_of[t];
    }
    return BERTH_OK;
}

static berth_status reject_unsupported(const struct rd *r)
{
    char p[G4_PATH_MAX];
    berth_status st;
    int flag = 0;
    const char *s = NULL;

    if ((st = rd_bool(r, "enable_moe_block", 0, &flag)) != BERTH_OK)
        return st;
    if (flag) {
        rd_path(r, "enable_moe_block", p);
        return g4_fail(r->host, BERTH_E_UNSUPPORTED,
                       "config.json: %s = true: enable_moe_block is not supported yet by the gemma4 plugin", p);
    }
    if ((st = rd_bool(r, "attention_bias", 0, &flag)) != BERTH_OK)
        return st;
    if (flag) {
        rd_path(r, "attention_bias", p);
        return g4_fail(r->host, BERTH_E_UNSUPPORTED,
                       "config.json: %s = true is not supported by the gemma4 plugin (no known checkpoint uses it)",
                       p);
    }
    /* "vision" only changes masks between image tokens: a no-op for text. "all" makes attention bidirectional. */
    rd_path(r, "use_bidirectional_attention", p);
    int32_t kind = rd_kind(r, "use_bidirectional_attention");
    if (kind == BERTH_JSON_BOOL) {
        if ((st = rd_bool(r, "use_bidirectional_attention", 0, &flag)) != BERTH_OK)
            return st;
        if (flag)
            return g4_fail(r->host, BERTH_E_UNSUPPORTED,
                           "config.json: %s = true is not supported (gemma4 runs causal text attention)", p);
    } else if (kind != BERTH_JSON_MISSING && kind != BERTH_JSON_NULL) {
        if ((st = rd_string(r, "use_bidirectional_attention", &s)) != BERTH_OK)
            return st;
        if (strcmp(s, "vision") != 0)
            return g4_fail(r->host, BERTH_E_UNSUPPORTED,
                           "config.json: %s = '%s' is not supported (gemma4 runs causal text attention; only null "
                           "and 'vision' are accepted)", p, s);
    }
    if ((st = rd_string(r, "hidden_activation", &s)) != BERTH_OK)
        return st;
    if (s && strcmp(s, "gelu_pytorch_tanh") != 0 && strcmp(s, "gelu_new") != 0) {
        rd_path(r, "hidden_activation", p);
        return g4_fail(r->host, BERTH_E_UNSUPPORTED,
                       "config.json: %s = '%s' is not supported (gemma4 uses gelu_pytorch_tanh)", p, s);
    }
    return BERTH_OK;
}

/* --- entry point ------------------------------------------------------------------------------------------- */

void g4_config_free(struct g4_config *cfg)
{
    if (!cfg)
        return;
    free(cfg->layers);
    free(cfg);
}

static berth_status parse_sizes(const struct rd *r, struct g4_config *c, int *head_dim, int *n_kv)
{
    berth_status st;
    double softcap = 0;
    int present = 0;
    if ((st = rd_int32(r, "vocab_size", 262144, 1, INT32_MAX, NULL_REJECTED, &c->vocab)) ||
        (st = rd_int32(r, "hidden_size", 2304, 1, 1 << 20, NULL_REJECTED, &c->hidden)) ||
        (st = rd_int32(r, "intermediate_size", 9216, 1, 1 << 24, NULL_REJECTED, &c->intermediate)) ||
        (st = rd_int32(r, "num_hidden_layers", 30, 1, 1024, NULL_REJECTED, &c->n_layers)) ||
        (st = rd_int32(r, "num_attention_heads", 8, 1, G4_HEADS_MAX, NULL_REJECTED, &c->n_heads)) ||
        (st = rd_int32(r, "num_key_value_heads", 4, 1, G4_HEADS_MAX, NULL_REJECTED, n_kv)) ||
        (st = rd_int32(r, "head_dim", 256, 2, G4_HD_MAX, NULL_REJECTED, head_dim)) ||
        (st = rd_int32(r, "sliding_window", 512, 1, INT32_MAX, NULL_REJECTED, &c->window)) ||
        (st = rd_int32(r, "max_position_embeddings", 131072, 1, INT32_MAX, NULL_REJECTED, &c->max_positions)) ||
        (st = rd_int32(r, "num_kv_shared_layers", 0, 0, 1024, NULL_IS_DEFAULT, &c->n_kv_shared)) ||
        /* null or 0 disables per-layer embeddings (26B, 31B) */
        (st = rd_int32(r, "hidden_size_per_layer_input", 256, 0, 65536, NULL_IS_DEFAULT, &c->ple_dim)))
        return st;
    if (rd_kind(r, "hidden_size_per_layer_input") == BERTH_JSON_NULL)
        c->ple_dim = 0;
    if (c->ple_dim > 0 &&
        (st = rd_int32(r, "vocab_size_per_layer_input", 262144, 1, INT32_MAX, NULL_REJECTED, &c->ple_vocab)))
        return st;
    if ((st = rd_real(r, "rms_norm_eps", 1e-6, &c->eps, &present)) != BERTH_OK)
        return st;
    if (!(c->eps > 0.0 && c->eps < 1.0)) {
        char p[G4_PATH_MAX];
        rd_path(r, "rms_norm_eps", p);
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %g is out of range (0, 1)", p, c->eps);
    }
    if ((st = rd_real(r, "final_logit_softcapping", 0.0, &softcap, &present)) != BERTH_OK)
        return st;
    if (present && !(softcap > 0.0)) {
        char p[G4_PATH_MAX];
        rd_path(r, "final_logit_softcapping", p);
        return g4_fail(r->host, BERTH_E_INVALID, "config.json: %s = %g must be positive (or null for none)", p,
                       softcap);
    }
    c->softcap = present ? softcap : 0.0;
    if ((st = rd_bool(r, "use_double_wide_mlp", 0, &c->double_wide_mlp)) ||
        (st = rd_bool(r, "attention_k_eq_v", 0, &c->k_eq_v)))
        return st;
    return BERTH_OK;
}

berth_status g4_config_parse(const berth_host *host, const berth_checkpoint *ck, struct g4_config **out)
{
    int multimodal = 0, head_dim = 0, n_kv = 0;
    char hd_src[G4_N_TYPES][G4_PATH_MAX], kv_src[G4_N_TYPES][G4_PATH_MAX];
    berth_status st = g4_config_model_type(host, ck, &multimodal);
    if (st != BERTH_OK)
        return st;

    struct g4_config *c = calloc(1, sizeof *c);
    if (!c)
        return g4_fail(host, BERTH_E_NOMEM, "out of memory parsing config.json");
    snprintf(c->model_type, sizeof c->model_type, "%s", multimodal ? "gemma4" : "gemma4_text");
    snprintf(c->key_base, sizeof c->key_base, "%s", multimodal ? "text_config" : "");
    snprintf(c->tensor_prefix, sizeof c->tensor_prefix, "%s", multimodal ? "model.language_model." : "model.");
    struct rd top = {host, ck, ""};
    struct rd r = {host, ck, c->key_base};

    if (multimodal) {
        int32_t kind = rd_kind(&top, "text_config");
        if (kind != BERTH_JSON_OBJECT) {
            st = g4_fail(host, BERTH_E_INVALID, "config.json: model_type 'gemma4' needs a text_config object, got %s",
                         kind_name(kind));
            goto fail;
        }
    }
    if ((st = reject_unsupported(&r)) != BERTH_OK || (st = parse_sizes(&r, c, &head_dim, &n_kv)) != BERTH_OK)
        goto fail;
    /* tie_word_embeddings: the text config's value, else the top level's, else true. */
    if (multimodal && rd_kind(&r, "tie_word_embeddings") == BERTH_JSON_MISSING)
        st = rd_bool(&top, "tie_word_embeddings", 1, &c->tied);
    else
        st = rd_bool(&r, "tie_word_embeddings", 1, &c->tied);
    if (st != BERTH_OK)
        goto fail;

    c->layers = calloc((size_t)c->n_layers, sizeof *c->layers);
    if (!c->layers) {
        st = g4_fail(host, BERTH_E_NOMEM, "out of memory parsing config.json");
        goto fail;
    }
    if ((st = parse_layer_types(&r, c)) != BERTH_OK)
        goto fail;
    for (int i = 0; i < c->n_layers; i++)
        c->type_used[c->layers[i].type] = 1;
    if ((st = resolve_heads(&r, c, head_dim, n_kv, hd_src, kv_src)) != BERTH_OK ||
        (st = check_and_wire(&r, c, hd_src, kv_src)) != BERTH_OK || (st = parse_rope(&r, c)) != BERTH_OK ||
        (st = parse_token_ids(&r, multimodal ? &top : &r, c)) != BERTH_OK)
        goto fail;
    *out = c;
    return BERTH_OK;
fail:
    g4_config_free(c);
    return st;
}

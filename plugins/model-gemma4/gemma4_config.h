/*
 * gemma4_config.h — Gemma 4 hyper-parameters resolved from config.json (spec gemma4.md §1, legality rules §6).
 *
 * g4_config_parse reads every key the forward pass depends on through the host's checkpoint services, applies
 * the HF 5.17 defaults and resolution rules (per_layer_config with zero-padded keys, global_head_dim absent =>
 * 512, last layer forced to full, KV-sharing sources) and rejects what the plugin cannot run faithfully. Every
 * error names config.json, the key and the value.
 */
#ifndef BERTH_GEMMA4_CONFIG_H
#define BERTH_GEMMA4_CONFIG_H

#include <berth/plugin.h>

#define G4_SLIDING 0
#define G4_FULL 1
#define G4_N_TYPES 2
#define G4_MAX_EOS 8

/* RoPE of one layer type (§3.4). */
struct g4_rope {
    int proportional;             /* rope_type "proportional"; else "default" */
    double theta;                 /* rope_theta */
    double partial_rotary_factor; /* proportional only (default 1.0) */
    double factor;                /* proportional only (default 1.0) */
};

/* One decoder layer after resolution. */
struct g4_layer {
    int type;       /* G4_SLIDING or G4_FULL (after the last-layer rewrite) */
    int head_dim;   /* hd_i */
    int n_kv_heads; /* K_i */
    int mlp_width;  /* I_i (2*I on KV-shared layers with use_double_wide_mlp) */
    int kv_shared;  /* i >= F: reads another layer's cache, stores nothing */
    int kv_src;     /* layer whose cache this layer attends over (itself when it owns one) */
    int kv_group;   /* index of the KV group (memory layout) holding kv_src's cache */
    int kv_index;   /* index of kv_src's cache inside that group */
    int v_from_k;   /* attention_k_eq_v on a full layer: no v_proj, V from the raw K projection */
};

struct g4_config {
    char model_type[16];    /* "gemma4_text" or "gemma4" */
    char key_base[16];      /* "" (gemma4_text) or "text_config" (gemma4): where the text keys live */
    char tensor_prefix[32]; /* "model." or "model.language_model." */

    int vocab;         /* V */
    int hidden;        /* D */
    int intermediate;  /* I */
    int n_layers;      /* L */
    int n_heads;       /* H */
    int window;        /* W (sliding layers) */
    int ple_dim;       /* Dp; 0 = no per-layer embeddings */
    int ple_vocab;     /* Vp (meaningful when ple_dim > 0) */
    int n_kv_shared;   /* S */
    int first_shared;  /* F = L - S */
    int max_positions; /* max_position_embeddings */
    int double_wide_mlp;
    int k_eq_v;        /* attention_k_eq_v */
    int tied;          /* tie_word_embeddings */
    double eps;        /* rms_norm_eps */
    double softcap;    /* final_logit_softcapping; 0 = none */

    int bos_id;        /* -1 if none */
    int n_eos;
    int eos_ids[G4_MAX_EOS];

    /* Per type: used by any layer? geometry shared by all layers of the type (enforced), RoPE. */
    int type_used[G4_N_TYPES];
    int type_head_dim[G4_N_TYPES];
    int type_kv_heads[G4_N_TYPES];
    struct g4_rope rope[G4_N_TYPES];

    /* KV groups: one per type that has non-shared layers, sliding first. */
    int n_kv_groups;
    int group_type[G4_N_TYPES];
    int group_layers[G4_N_TYPES]; /* caches stored in the group */

    struct g4_layer *layers; /* [n_layers] */
};

/* "sliding_attention" / "full_attention". */
const char *g4_type_name(int type);

/* Read config.json's model_type. BERTH_OK with *multimodal = 1 for "gemma4", 0 for "gemma4_text";
 * BERTH_E_UNSUPPORTED (message naming the model_type and what this plugin handles) otherwise. */
berth_status g4_config_model_type(const berth_host *host, const berth_checkpoint *ck, int *multimodal);

/* Parse and validate. On success *out is caller-owned (g4_config_free). On failure the message is set. */
berth_status g4_config_parse(const berth_host *host, const berth_checkpoint *ck, struct g4_config **out);
void g4_config_free(struct g4_config *cfg);

#endif

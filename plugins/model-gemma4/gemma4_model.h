/*
 * gemma4_model.h — the Gemma 4 model object shared by the plugin's files, and the functions they offer each
 * other. Nothing here is global: everything a call needs hangs off struct berth_model.
 */
#ifndef BERTH_GEMMA4_MODEL_H
#define BERTH_GEMMA4_MODEL_H

#include <berth/model.h>

#include "gemma4_config.h"

/* Weights of one decoder layer (spec §2.3). Tensors with buf NULL are absent (k/v/k_norm on KV-shared
 * layers, v_proj when V comes from K, PLE tensors when Dp = 0). */
struct g4_layer_weights {
    berth_tensor input_norm, q_proj, q_norm, k_proj, v_proj, k_norm, o_proj, post_attn_norm;
    berth_tensor pre_ff_norm, gate_proj, up_proj, down_proj, post_ff_norm;
    berth_tensor ple_gate, ple_proj, ple_post_norm;
    /* Fused projections (gemma4_weights.c, fusion): q|k|v rows of a non-shared layer in one matrix, gate|up rows
     * in one matrix. buf NULL when not fused; then q_proj.. are separate. When fused, q_proj, k_proj, v_proj,
     * gate_proj and up_proj are views into these. */
    berth_tensor qkv, gate_up;
    float layer_scalar;
};

struct g4_weights {
    berth_tensor embed;          /* embed_tokens [V, D] */
    berth_tensor ple_embed;      /* embed_tokens_per_layer [Vp, L*Dp] */
    berth_tensor ple_model_proj; /* per_layer_model_projection [L*Dp, D] */
    berth_tensor ple_proj_norm;  /* per_layer_projection_norm [Dp] */
    berth_tensor final_norm;     /* norm [D] */
    berth_tensor lm_head;        /* lm_head [V, D], or a copy of embed when tied */
    struct g4_layer_weights *layers;
};

/* One checkpoint tensor the model binds: full name, where it goes, the exact shape it must have. */
struct g4_plan_entry {
    char name[160];
    berth_tensor *dst; /* NULL for layer_scalar, which is read on the host into *scalar */
    float *scalar;
    int ndim;
    int64_t shape[2]; /* PyTorch order (outermost first) */
};

/* Byte offsets of the activation scratch inside one backend buffer (sized for max_batch_tokens rows). */
struct g4_scratch {
    uint64_t x[2];  /* residual stream, ping-pong [D, T] */
    uint64_t u;     /* normed input of a block; final gathered rows [D, T] */
    uint64_t a;     /* output of a block before its post-norm [D, T] */
    uint64_t q;     /* queries [hd, H, T] */
    uint64_t att;   /* attention output [hd, H, T] */
    uint64_t k, v;  /* new keys / values [hd, K, T] */
    uint64_t gate, up; /* MLP [I_i, T] (the fused gate|up product lands here already through the GLU epilogue) */
    uint64_t qkv;   /* fused q|k|v projection output [H hd + 2 K hd, T] */
    uint64_t ple_a; /* PLE token part [L*Dp, T] */
    uint64_t ple;   /* per-layer inputs [L*Dp, T] */
    uint64_t pg;    /* PLE gate [Dp, T] */
    uint64_t bytes;
};

struct berth_model {
    const berth_host *host;
    struct g4_config *cfg;

    struct g4_weights w;
    struct g4_plan_entry *plan;
    int n_plan;

    berth_kv_group_desc groups[G4_N_TYPES];
    const berth_kv_group_desc *group_ptrs[G4_N_TYPES];

    /* requirements(): one entry per distinct op + parameters forward() issues. Each requirement, its params
     * and its text are separate allocations owned through these arrays (requirements() hands out reqs). */
    berth_requirement **reqs;
    void **req_params;
    char **req_what;
    int n_reqs, cap_reqs;

    /* RoPE per type: host table and its place in const_buf */
    float *rope_freqs[G4_N_TYPES];
    int rope_pairs[G4_N_TYPES];
    uint64_t rope_off[G4_N_TYPES];

    /* set by load() */
    const berth_backend_api *be;
    berth_buffer *scratch_buf;
    struct g4_scratch scratch;
    berth_buffer *const_buf; /* RoPE tables (f32) */
    berth_buffer *fused_buf; /* fused projection weights (NULL unless fused) */
    int fused;               /* forward() uses lw->qkv / lw->gate_up where present */
    int q_in_kv;             /* q-norm + RoPE of layers that store K/V go inside their kv_append (ABI 0.5), else
                              * as an rms_norm ([model.gemma4] q_norm_in_kv_append, default true; set by load) */
    int max_tokens;
    int loaded; /* load() finished: forward() may run */

    int64_t n_forward_calls, n_prefill_tokens, n_decode_steps, n_logit_rows;
};

/* gemma4_weights.c */
/* Build m->plan from m->cfg (names, destinations, shapes). */
berth_status g4_weights_plan(berth_model *m);
/* Give every planned tensor its expected shape and the dtype the checkpoint stores (f32 where unknown), buf
 * NULL: enough for requirements() before any weight is bound. */
void g4_weights_describe(berth_model *m, const berth_checkpoint *ck);
/* Check every planned tensor (present, dtype f32/bf16/f16, exact shape), refuse unknown tensors under the text
 * prefix, bind through host->tensor_load and read the layer scalars. */
/* On a backend that copies weights anyway (no BERTH_CAP_WRAP_HOST), q|k|v and gate|up of each layer are uploaded
 * into one matrix each (m->fused_buf) instead of through tensor_load: one matmul launch instead of two or three,
 * and longer weight streams; sets m->fused. Uploads go on stream s. */
berth_status g4_weights_bind(berth_model *m, const berth_backend_api *be, const berth_checkpoint *ck,
                             berth_stream *s);
/* Shape-only fused tensors (buf NULL) for requirements(), from the described member tensors. */
void g4_weights_describe_fused(berth_model *m);
void g4_weights_free(berth_model *m);

/* gemma4_requirements.c */
/* Record op + params (copied, tensors reduced to dtype and shape) unless an equal one exists. site names the
 * call ("q_proj") for the message. */
berth_status g4_req_record(berth_model *m, int32_t op, const void *params, const char *site);
void g4_req_free(berth_model *m);

/* gemma4_forward.c */
/* Run forward() once in recording mode over a one-token batch to fill the requirement list. */
berth_status g4_requirements_build(berth_model *m);
/* Lay out and allocate the activation scratch for max_tokens rows on m->be. */
berth_status g4_scratch_alloc(berth_model *m, int max_tokens);
/* One step (model.h forward()). */
berth_status g4_forward(berth_model *m, berth_stream *s, const berth_batch *b);

#endif

/*
 * berth/model.h — the model-architecture plugin kind.
 *
 * A model plugin turns a Hugging Face checkpoint (config.json + safetensors, opened and validated by the host)
 * into forward steps expressed as backend ops. It never owns request state: the host's scheduler and paged KV
 * cache decide which sequences run, where their KV pages and recurrent-state slots are, and which rows need
 * logits. The plugin declares what per-sequence memory it needs (berth_memory_layout) and the host manages it.
 *
 * Life cycle, all on one host thread:
 *   accept()        -> does this plugin handle the checkpoint? (BERTH_OK or BERTH_E_UNSUPPORTED + reason)
 *   create()        -> parse and validate config.json; no weights touched, no backend yet
 *   info(), memory_layout(), requirements()  -> the host sizes pools and picks a backend that supports every op
 *   load()          -> bind weights on the chosen backend (host->tensor_load), allocate scratch
 *   forward()*      -> one step over a batch mixing prefill chunks and decode tokens
 *   encode()*       -> encoder pass (encoder-decoder models only)
 *   destroy()
 */
#ifndef BERTH_MODEL_H
#define BERTH_MODEL_H

#include "backend.h"
#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct berth_model berth_model; /* plugin-owned */

/* Static facts about the loaded model. Out-struct: caller sets struct_size. */
typedef struct berth_model_info {
    uint32_t struct_size;
    int32_t vocab_size;     /* rows of the logits */
    int32_t n_layers;
    int32_t hidden_size;
    int32_t max_positions;  /* context limit (max_position_embeddings) */
    int32_t bos_id;         /* -1 if none */
    int32_t n_eos;          /* number of valid entries in eos_ids */
    int32_t eos_ids[8];
    int32_t is_encoder_decoder;
    int32_t decoder_start_id; /* -1 unless encoder-decoder */
    char arch[64];          /* "gemma4_text" */
    /* ABI 0.2: fields above. */
    /* 1 when forward() may be recorded in a backend graph (BERTH_CAP_GRAPHS) and replayed: for a given shape
     * (n_tokens, n_seqs, n_logits, and the same tensors and buffers in the batch) it always enqueues the same
     * ops with the same parameters, reads no h_* array to decide what to enqueue, and never syncs or transfers.
     * A replayed step does not call forward(), so plugin counters do not see it. Default (older plugin): 0.
     * (ABI 0.3) */
    int32_t graph_safe;
    /* 1 when forward() accepts a batch whose h_tokens is NULL: the ids are then only in batch.tokens on the device,
     * fed there from the previous step's sample op without a round trip through the host (the host prepares step
     * N+1 while step N still runs). Every such id came from sampling this model's logits, so it is in
     * [0, vocab_size); a plugin that needs more (a smaller embedding table) leaves this 0. Default (older plugin):
     * 0, and the host always passes h_tokens. (0.3) */
    int32_t h_tokens_optional;
    /* ABI 0.3: fields above. Append below only. */
} berth_model_info;

/* ---------------------------------------------------------------------------------------------------------------
 * Per-sequence memory the host manages for the model. */
#define BERTH_KV_FULL 0    /* causal attention over all positions */
#define BERTH_KV_SLIDING 1 /* causal attention over the last `window` positions; older blocks may be released */
#define BERTH_KV_CROSS 2   /* written once by encode(), read non-causally by decoder steps (length = encoder input) */
#define BERTH_KV_ENCODER 3 /* encoder self-attention, non-causal, only alive during encode() */

/* One page group: layers whose caches share a block table (same kind, window and geometry). Layers that read
 * another layer's cache (KV sharing) are not counted here: they store nothing. */
typedef struct berth_kv_group_desc {
    uint32_t struct_size;
    int32_t kind;       /* BERTH_KV_* */
    int32_t window;     /* BERTH_KV_SLIDING: keys visible to a query, including itself; else 0 */
    int32_t n_layers;   /* caches stored in this group (one per non-shared layer) */
    int32_t n_kv_heads;
    int32_t head_dim;   /* K */
    int32_t head_dim_v; /* V */
    char name[32];      /* "sliding", "full" — for stats and messages */
} berth_kv_group_desc;

/* One per-sequence recurrent state tensor (e.g. GDN conv state, GDN delta state of one layer group). The host
 * allocates a pool with ne = {shape..., n_slots} (slot outermost), zeroes a slot when a sequence starts, and
 * may snapshot/restore slots with buffer_copy for prefix caching. */
typedef struct berth_state_desc {
    uint32_t struct_size;
    berth_dtype dtype;
    int32_t ndim;        /* dims of one slot, 1..3 */
    int32_t reserved0;
    int64_t ne[3];       /* ggml order */
    char name[32];
} berth_state_desc;

/* Out-struct (caller sets struct_size); arrays are plugin-owned, valid until destroy. */
typedef struct berth_memory_layout {
    uint32_t struct_size;
    int32_t n_kv_groups;
    const berth_kv_group_desc *const *kv_groups;
    int32_t n_states;
    int32_t reserved0;
    const berth_state_desc *const *states;
} berth_memory_layout;

/* One op the model will run, with the exact parameters that matter for support (tensors' buf NULL, dtypes and
 * shapes set; absent optional tensors all-zero, see backend.h). The host passes each to the backend's
 * supports(). requirements() returns an array of POINTERS to these, so the struct can grow by struct_size. */
typedef struct berth_requirement {
    uint32_t struct_size;
    int32_t op;          /* BERTH_OP_* */
    const void *params;  /* the op's params struct */
    const char *what;    /* "attention (head_dim 512, window 0)" — for messages */
} berth_requirement;

/* ---------------------------------------------------------------------------------------------------------------
 * Loading. */
typedef struct berth_load_params {
    uint32_t struct_size;
    int32_t max_batch_tokens; /* most tokens in one forward() (sizes the scratch) */
    int32_t max_seqs;         /* most sequences in one forward() */
    berth_dtype act_dtype;    /* activation dtype the host asks for (F32 unless the backend offers others) */
    berth_dtype kv_dtype;     /* element type of the KV pools the host will pass */
    const berth_checkpoint *checkpoint; /* open until destroy */
    /* ABI 0.1: fields above. */
    /* The host's stream on the chosen backend, for load()'s own transfers (upload constant tables, then sync);
     * the same stream forward()/encode() will be given. Valid for the call only: the host destroys it, so the
     * plugin must neither keep nor destroy it. Absent (older host): create a private stream, or fail with
     * BERTH_E_ABI. */
    berth_stream *stream;
    /* ABI 0.2: fields above. Append below only. */
} berth_load_params;

/* ---------------------------------------------------------------------------------------------------------------
 * A forward step. Tensors live in backend buffers (the host uploads metadata each step); the h_* arrays are host
 * copies of the same values for plugins that need them to plan work. All valid for the call only. */
typedef struct berth_kv_group_batch {
    berth_kv_view pool;       /* layer 0 of the group; layer l adds l * layer_stride to k_offset and v_offset */
    uint64_t layer_stride;
    berth_tensor block_table; /* ne {max_blocks, n_seqs} i32 */
    berth_tensor slots;       /* ne {n_tokens} i32: where each new token's K/V goes (negative: not stored) */
    /* Keys per sequence in this group, ne {n_seqs} i32, when they differ from berth_batch.seq_kv_len (NLLB's
     * CROSS groups hold the encoder input's length). Absent (buf NULL) = use berth_batch.seq_kv_len. (ABI 0.2) */
    berth_tensor seq_kv_len;
    const int32_t *h_seq_kv_len; /* host copy of seq_kv_len; NULL exactly when it is absent (ABI 0.2) */
} berth_kv_group_batch;

typedef struct berth_state_batch {
    berth_tensor pool;        /* ne {shape..., n_slots} */
} berth_state_batch;

typedef struct berth_batch {
    uint32_t struct_size;
    int32_t n_tokens;
    int32_t n_seqs;
    int32_t n_logits;        /* rows that need logits */
    int32_t max_q_len;       /* max over sequences of new tokens */
    int32_t max_kv_len;      /* max over sequences of seq_kv_len */
    berth_tensor tokens;      /* ne {n_tokens} i32, sequences back to back */
    berth_tensor positions;   /* ne {n_tokens} i32, absolute positions */
    berth_tensor seq_q_start; /* ne {n_seqs+1} i32 */
    berth_tensor seq_kv_len;  /* ne {n_seqs} i32: keys per sequence after this step */
    berth_tensor logit_rows;  /* ne {n_logits} i32: token indices whose logits are wanted, ascending and distinct
                               * (so n_logits == n_tokens means 0 .. n_tokens-1, in every replay of a graph too) */
    berth_tensor state_slots; /* ne {n_seqs} i32, or absent when the model has no states */
    /* h_tokens is NULL when the ids are on the device only (berth_model_info.h_tokens_optional, 0.3) */
    const int32_t *h_tokens, *h_positions, *h_seq_q_start, *h_seq_kv_len, *h_logit_rows;
    int32_t n_kv_groups;      /* = memory_layout.n_kv_groups */
    int32_t n_states;
    const berth_kv_group_batch *kv;    /* [n_kv_groups] */
    const berth_state_batch *states;   /* [n_states] */
    berth_tensor logits;      /* out: ne {vocab, n_logits} f32, host-allocated */
    /* ABI 0.1: fields above. Appended in ABI 0.3 (read them only when struct_size covers them: BERTH_HAS): */
    const int32_t *h_state_slots; /* host copy of state_slots, [n_seqs]; NULL exactly when state_slots is absent */
    /* ABI 0.3: fields above. Append below only. */
} berth_batch;

/* Named counters a plugin keeps (tokens prefilled, decode steps, ...), for tests and --stats. */
typedef struct berth_counter {
    const char *name; /* static */
    int64_t value;
} berth_counter;

/* ---------------------------------------------------------------------------------------------------------------
 * The model function table (descriptor->vtable for kind BERTH_PLUGIN_MODEL). */
typedef struct berth_model_vtable {
    uint32_t struct_size;
    /* NULL-terminated list of config.json model_type values this plugin handles; static. */
    const char *const *model_types;
    /* (required) BERTH_OK if this plugin will run the checkpoint; BERTH_E_UNSUPPORTED with a reason otherwise. */
    berth_status (*accept)(const berth_host *host, const berth_checkpoint *ck);
    /* (required) Parse and validate config.json. host stays valid until destroy. */
    berth_status (*create)(const berth_host *host, const berth_checkpoint *ck, berth_model **out);
    void (*destroy)(berth_model *m); /* (required) accepts NULL */
    berth_status (*info)(const berth_model *m, berth_model_info *out);                /* (required) */
    berth_status (*memory_layout)(const berth_model *m, berth_memory_layout *out);   /* (required) */
    /* (required) Ops the model will run: *out = an array of *n pointers to requirements (none NULL, each with
     * its own struct_size); array and requirements plugin-owned, valid until destroy. */
    berth_status (*requirements)(const berth_model *m, const berth_requirement *const **out, int32_t *n);
    /* (required) Bind weights and allocate scratch on the backend. Called once. Transfers go on lp->stream. */
    berth_status (*load)(berth_model *m, const berth_backend_api *be, const berth_load_params *lp);
    /* (required) One step on stream s. Writes batch->logits; appends new K/V; updates states. */
    berth_status (*forward)(berth_model *m, berth_stream *s, const berth_batch *batch);
    /* (optional) Encoder pass for encoder-decoder models: batch->tokens are encoder inputs; fills the CROSS
     * groups' pages of each sequence. */
    berth_status (*encode)(berth_model *m, berth_stream *s, const berth_batch *batch);
    /* (optional) Copy up to cap counters into out; *n = how many exist. */
    berth_status (*counters)(const berth_model *m, berth_counter *out, int32_t cap, int32_t *n);
    /* ABI 0.1: fields above. Append below only. */
} berth_model_vtable;

#ifdef __cplusplus
}
#endif
#endif /* BERTH_MODEL_H */

/*
 * berth/backend.h — the backend plugin kind: devices, buffers, streams, capabilities and the op table.
 *
 * Execution model: a model plugin runs a forward step by calling ops from berth_ops one after another on a
 * stream (eager dispatch). A backend may execute each op at once (CPU) or enqueue it (GPU). Results are visible
 * to the host after stream_sync(). Each op is specified below precisely enough that two backends agree to
 * rounding: all arithmetic accumulates in fp32 whatever the storage dtype.
 *
 * Shapes use berth_tensor's ggml order (ne[0] innermost). "rows" of a tensor are all elements sharing the
 * outer indices (ne[1]*ne[2]*ne[3] rows of ne[0] elements). Unless an op says otherwise, its tensors must be
 * row-regular: nb[0] = element size, any nb[1..3] (views into a larger tensor are allowed).
 *
 * OPTIONAL TENSORS (marked "or absent" / "optional" below). Whether one is there is decided exactly so, and
 * supports() and execution must agree on it:
 *   - in execution (a berth_ops call), an optional tensor is absent when its buf is NULL;
 *   - in supports() queries, where every buf is NULL, it is absent when its ne[0] == 0 (callers leave an absent
 *     tensor all-zero, so a memset(0) berth_tensor is absent in both cases). A present tensor has ne[0] >= 1.
 * Tensors an op only reads in some modes (a norm weight when the mode has none, RoPE inputs when rope_n_pairs
 * is 0, top_ids when n_top is 0) are ignored outside those modes, whatever they hold.
 */
#ifndef BERTH_BACKEND_H
#define BERTH_BACKEND_H

#include "plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct berth_backend berth_backend; /* one initialised device of one backend */
typedef struct berth_graph berth_graph;     /* a recorded sequence of ops (BERTH_CAP_GRAPHS) */
typedef struct berth_event berth_event;     /* a point in a stream's order (event_*, 0.3) */

/* ---------------------------------------------------------------------------------------------------------------
 * Capabilities (bits of berth_device_info.caps). Bit values fixed forever. */
#define BERTH_CAP_WRAP_HOST (1ull << 0)    /* buffer_wrap_host works: compute directly on host memory */
#define BERTH_CAP_HOST_VISIBLE (1ull << 1) /* buffer_host_ptr works: buffers are addressable by the host */
#define BERTH_CAP_ASYNC (1ull << 2)        /* ops are enqueued; results need stream_sync */
#define BERTH_CAP_GRAPHS (1ull << 3)       /* graph_begin/end/launch/destroy work: record a step once, replay it */
#define BERTH_CAP_KNOWN_MASK ((1ull << 4) - 1)

/* Probe result: is the hardware there at all? Out-struct: caller sets struct_size. */
typedef struct berth_probe_info {
    uint32_t struct_size;
    int32_t n_devices;  /* 0 when no usable device; then message says why */
    char message[256];  /* e.g. "0 CUDA devices: cudaGetDeviceCount: no CUDA-capable device is detected" */
} berth_probe_info;

/* One device. Out-struct: caller sets struct_size. */
typedef struct berth_device_info {
    uint32_t struct_size;
    int32_t index;
    char name[128];           /* "NVIDIA H200", "x86_64 CPU (16 threads, avx2)" */
    uint64_t total_memory;    /* bytes the backend can allocate on it */
    uint64_t free_memory;     /* bytes free now (best effort) */
    uint64_t caps;            /* BERTH_CAP_* */
    uint32_t weight_dtypes;   /* BERTH_DTYPE_BIT() set of matmul weight dtypes */
    uint32_t act_dtypes;      /* BERTH_DTYPE_BIT() set of activation dtypes */
    uint32_t kv_dtypes;       /* BERTH_DTYPE_BIT() set of KV-cache dtypes */
    int32_t compute_units;    /* threads / SMs */
    /* ABI 0.2: fields above. */
    berth_dtype preferred_kv_dtype; /* KV element type the host uses when its config says "auto" (one of kv_dtypes).
                                     * Default (older plugin): F32. (ABI 0.3) */
    /* ABI 0.3: fields above. Append below only. */
} berth_device_info;

/* Buffer usage hints. */
#define BERTH_USAGE_WEIGHTS 0
#define BERTH_USAGE_ACTIVATIONS 1
#define BERTH_USAGE_KV 2
#define BERTH_USAGE_STATE 3
#define BERTH_USAGE_STAGING 4 /* host<->device transfers; pinned where that helps */

/* ---------------------------------------------------------------------------------------------------------------
 * Op identifiers (for supports() and for model requirement lists). Append-only. */
#define BERTH_OP_MATMUL 0
#define BERTH_OP_GET_ROWS 1
#define BERTH_OP_RMS_NORM 2
#define BERTH_OP_LAYER_NORM 3
#define BERTH_OP_ROPE 4
#define BERTH_OP_UNARY 5
#define BERTH_OP_GLU 6
#define BERTH_OP_BINARY 7
#define BERTH_OP_COPY 8
#define BERTH_OP_KV_APPEND 9
#define BERTH_OP_ATTENTION 10
#define BERTH_OP_CONV1D_CAUSAL 11
#define BERTH_OP_GATED_DELTA 12
#define BERTH_OP_GATED_RMS_NORM 13
#define BERTH_OP_LOG_SOFTMAX_TOPK 14
#define BERTH_OP_SAMPLE 15
#define BERTH_OP_COUNT 16

/* Activation functions f(x) used by UNARY and GLU. */
#define BERTH_ACT_IDENTITY 0
#define BERTH_ACT_GELU_TANH 1 /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
#define BERTH_ACT_GELU_ERF 2  /* 0.5 x (1 + erf(x / sqrt 2)) */
#define BERTH_ACT_SILU 3      /* x / (1 + e^-x) */
#define BERTH_ACT_RELU 4
#define BERTH_ACT_SIGMOID 5
#define BERTH_ACT_TANH 6
#define BERTH_ACT_SOFTPLUS 7  /* log(1 + e^x), computed stably: max(x, 0) + log1p(e^-|x|) (equal to rounding to
                               * PyTorch's softplus, whose x > 20 -> x shortcut changes nothing in fp32) (ABI 0.2) */
#define BERTH_ACT_EXP 8       /* e^x (ABI 0.2) */

/* ---------------------------------------------------------------------------------------------------------------
 * Op parameter structs. Every one starts with struct_size (set by the caller to what it was compiled with);
 * a backend treats fields beyond struct_size as their documented default. */

/* y[m, n] = sum_k x[m, k] * w[n, k]  (+ bias[n])  (+ y[m, n] if accumulate).
 * x: ne {K, M} (rows may be strided), f32 or bf16/f16 activations the device lists in act_dtypes.
 * w: ne {K, N}, packed, any dtype in weight_dtypes (converted to fp32 inside the product).
 * bias: ne {N} or absent. y: ne {N, M} f32 (or an act dtype). Higher dims of x/y are flattened into M. */
typedef struct berth_matmul_params {
    uint32_t struct_size;
    int32_t accumulate; /* 0: y = x w^T + b; 1: y += x w^T + b */
    berth_tensor x, w, bias, y;
    /* ABI 0.2: fields above. The RMS-norm prologue (ABI 0.3, appended): when struct_size covers x_norm_w and
     * x_norm_mode != BERTH_NORM_W_NONE, each row of x is first RMS-normalised over K in fp32,
     * x / sqrt(mean(x^2) + x_norm_eps), then weighted as x_norm_mode says (BERTH_NORM_W: * x_norm_w,
     * W_ONE_PLUS: * (1 + x_norm_w), UNIT: no weight) — exactly rms_norm's row math — and that normalised row is
     * what multiplies w. x must then be f32; x_norm_eps > 0 and finite; x_norm_w (modes W, W_ONE_PLUS only):
     * ne {K}, any weight dtype. x itself is not modified. Default (older caller or mode W_NONE): no prologue. */
    int32_t x_norm_mode;
    float x_norm_eps;
    berth_tensor x_norm_w;
    /* The gated epilogue (ABI 0.3, appended): when struct_size covers y_glu_up and y_glu != BERTH_GLU_NONE, the
     * product z = x w^T (+ bias), after the prologue if any, is not stored; instead, with f = y_glu_act
     * (BERTH_ACT_*), exactly as the glu op computes it:
     *   BERTH_GLU_HALVES  w ne {K, 2N} holds the gate rows then the up rows (bias, if any, ne {2N}); y ne {N, M}:
     *                     y[m, n] = f(z[m, n]) * z[m, N + n]          (a fused gate|up projection + GLU)
     *   BERTH_GLU_MUL     w ne {K, N}; y_glu_up ne {N, M} f32 (rows may be strided; may be y itself):
     *                     y[m, n] = f(z[m, n]) * y_glu_up[m, n]        (a gate projection times a given up)
     * accumulate must be 0. Default (older caller or BERTH_GLU_NONE): y = z. */
    int32_t y_glu;
    int32_t y_glu_act;
    berth_tensor y_glu_up;
    /* A norm after the product (ABI 0.3, appended): when struct_size covers y_norm and y_norm is not NULL, the op is
     * this matmul followed by the rms_norm *y_norm, whose x is exactly this op's y (same buffer, offset, dtype,
     * ne and nb) and which obeys every rms_norm rule (its own struct_size; no RoPE). One op instead of two, so a
     * backend may finish the norm inside the product's kernel once each row of y is complete (a projection and the
     * post-norm that adds it to the residual stream). The caller keeps *y_norm alive for the call. Default (older
     * caller or NULL): no norm. */
    const struct berth_rms_norm_params *y_norm;
    /* A norm before the product (ABI 0.4, appended; a caller relies on it, so 0.3 plugins are not accepted): when struct_size covers x_pre and x_pre is not NULL, the op is
     * the rms_norm *x_pre followed by this matmul, whose x is exactly *x_pre's y2 when it has one, else its y (same
     * buffer, offset, dtype, ne and nb). Every output of the norm is written, as if it ran alone. One op instead of
     * two, so a backend may compute the norm in the product's prologue (at batch 1 each block of a GEMV can
     * recompute the one row it needs): a post-norm that feeds the next projection without a launch of its own. The
     * norm obeys every rms_norm rule (its own struct_size) and applies no RoPE; x_norm_mode must be W_NONE and
     * y_norm NULL. The caller keeps *x_pre alive for the call. Default (older caller or NULL): no norm. */
    const struct berth_rms_norm_params *x_pre;
    /* ABI 0.4: fields above. A second product after this one (ABI 0.6, appended; a caller relies on it, so 0.5
     * plugins are not accepted): when struct_size covers y_then and y_then is not NULL, the op is this matmul (with
     * its x_pre, prologue and epilogue) followed by the matmul *y_then, whose x is exactly this op's y (same buffer,
     * offset, dtype, ne and nb). *y_then may carry a y_norm but no x_pre, x_norm prologue, accumulate or y_then of
     * its own; this op may then have no y_norm and accumulate 0. Every output of both is written, as if they ran
     * in turn. One op instead of two, so a backend may run the pair in one kernel when the middle is narrow (a
     * bottleneck: Gemma 4's per-layer-input gate and projection, 256 wide between rows of 1536), keeping y on chip
     * between the products. The caller keeps *y_then (and its norms) alive for the call. Default (older caller or
     * NULL): no second product. */
    const struct berth_matmul_params *y_then;
    /* ABI 0.6: fields above. Append below only. */
} berth_matmul_params;
#define BERTH_GLU_NONE 0
#define BERTH_GLU_HALVES 1
#define BERTH_GLU_MUL 2

/* y[t, :] = scale * table[ids[t], :]. table ne {D, N} any weight dtype; ids ne {T} i32 (each in [0, N): the
 * caller validates); y ne {D, T} f32. */
typedef struct berth_get_rows_params {
    uint32_t struct_size;
    float scale;
    berth_tensor table, ids, y;
} berth_get_rows_params;

/* Norm weight modes (RMS_NORM's weight_mode, KV_APPEND's k_norm_mode and v_norm_mode) and residual modes
 * (RMS_NORM and LAYER_NORM). W_NONE reads differently in the two ops: rms_norm always normalises, so there it
 * means "no weight"; in kv_append it means "no norm at all" (a plain copy). UNIT says "normalise, no weight"
 * unambiguously: rms_norm treats it exactly as W_NONE, kv_append normalises without a weight. */
#define BERTH_NORM_W_NONE 0       /* rms_norm: no weight. kv_append: no norm at all */
#define BERTH_NORM_W 1            /* * w */
#define BERTH_NORM_W_ONE_PLUS 2   /* * (1 + w) (Gemma 2/3 style) */
#define BERTH_NORM_UNIT 3         /* normalise, no weight (ABI 0.2) */
#define BERTH_RESID_NONE 0        /* y = norm(x) */
#define BERTH_RESID_ADD_AFTER 1   /* y = residual + norm(x)          (sandwich / post-norm) */
#define BERTH_RESID_ADD_BEFORE 2  /* residual += x (in place); y = norm(residual)   (pre-norm) */

/* RMS norm over ne[0] of each row: n = x / sqrt(mean(x^2) + eps), then the weight mode, then the residual mode.
 * weight_mode W_NONE and UNIT are the same here (no weight). w (modes W, W_ONE_PLUS only): ne {ne0 of x} any
 * weight dtype, broadcast over rows. y may alias x. residual has x's shape. */
typedef struct berth_rms_norm_params {
    uint32_t struct_size;
    int32_t weight_mode;
    int32_t resid_mode;
    float eps;
    berth_tensor x, w, residual, y;
    /* ABI 0.2: fields above. Appended in ABI 0.3 (a caller whose struct_size stops short gets the defaults):
     * RoPE on the normalised rows: when rope_n_pairs > 0, x and y are ne {d, heads, T}, rope_positions ne {T} i32,
     * rope_freqs ne {rope_n_pairs} f32, and each row (token t = row / heads) is rotated after the weight exactly
     * as the rope op does (rope_mode, rope_pair_offset, rope_n_pairs as its mode, pair_offset, n_pairs) — q-norm
     * + RoPE in one op. resid_mode must then be NONE. Default rope_n_pairs 0: no rotation.
     * out_scale: y, as the modes above define it (for ADD_AFTER: residual + norm(x)), is multiplied by it — a
     * post-norm residual followed by a per-layer scalar in one op (ADD_BEFORE's updated residual is not scaled). The default 0.0f (a zeroed struct) means no scaling, as does 1.0f. */
    int32_t rope_mode;
    int32_t rope_pair_offset;
    int32_t rope_n_pairs;
    float out_scale;
    berth_tensor rope_positions, rope_freqs;
    /* A second, normalised output (ABI 0.3, appended; optional): when y2 is present, each row of y, as
     * finished above (after out_scale), is RMS-normalised again with the same eps and weighted by y2_weight_mode
     * / y2_w (as weight_mode / w), into y2: y2 = RMSNorm(y) * w2 — a post-norm residual and the next sublayer's
     * pre-norm in one pass. y2: y's shape, f32 (rows may be strided); it may alias neither x, y nor the residual.
     * Not with RoPE. Default (older caller or y2 absent): no second output. */
    int32_t y2_weight_mode;
    berth_tensor y2_w, y2;
    /* ABI 0.3: fields above. Append below only. */
} berth_rms_norm_params;

/* Layer norm over ne[0]: (x - mean) / sqrt(var + eps) (biased variance), * w + b (each optional), then the
 * residual mode as for RMS norm. There is no weight mode: absent w (and b) is the weightless (UNIT) norm. */
typedef struct berth_layer_norm_params {
    uint32_t struct_size;
    int32_t resid_mode;
    float eps;
    berth_tensor x, w, b, residual, y;
} berth_layer_norm_params;

/* Rotary embedding, in place allowed (y may alias x).
 * x, y: ne {d, heads, T}; positions: ne {T} i32; freqs: ne {n_pairs} f32.
 * For each token t, head h, pair j < n_pairs with angle a = (float)positions[t] * freqs[j] (fp32 product), the
 * pair (i0, i1) is rotated: y[i0] = x[i0] cos a - x[i1] sin a; y[i1] = x[i1] cos a + x[i0] sin a, where
 *   mode HALF:        i0 = j, i1 = j + pair_offset        (NeoX "rotate_half"; Gemma 4 full layers: d = 512,
 *                                                          pair_offset 256, n_pairs 64; Qwen3.5: d 256,
 *                                                          pair_offset 32, n_pairs 32)
 *   mode INTERLEAVED: i0 = 2j, i1 = 2j + 1                (GPT-J style)
 * Elements not in a rotated pair are copied unchanged. */
#define BERTH_ROPE_HALF 0
#define BERTH_ROPE_INTERLEAVED 1
typedef struct berth_rope_params {
    uint32_t struct_size;
    int32_t mode;
    int32_t pair_offset;
    int32_t n_pairs;
    berth_tensor x, positions, freqs, y;
} berth_rope_params;

/* y = out_scale * f(in_scale * x) elementwise. Softcap c*tanh(x/c) is ACT_TANH with in_scale 1/c, out_scale c;
 * a plain scale is ACT_IDENTITY. y may alias x. */
typedef struct berth_unary_params {
    uint32_t struct_size;
    int32_t act;
    float in_scale;
    float out_scale;
    berth_tensor x, y;
} berth_unary_params;

/* y = f(gate) * up elementwise (gated MLPs). gate, up, y have the same shape; gate and up may be views into one
 * fused projection output. y may alias gate or up. */
typedef struct berth_glu_params {
    uint32_t struct_size;
    int32_t act;
    berth_tensor gate, up, y;
} berth_glu_params;

/* y = a (op) b elementwise with b broadcast: each dim of b equals a's or is 1. y may alias a.
 * ADD: y = a + scale * b.  MUL: y = a * b * scale. */
#define BERTH_BINARY_ADD 0
#define BERTH_BINARY_MUL 1
typedef struct berth_binary_params {
    uint32_t struct_size;
    int32_t op;
    float scale;
    berth_tensor a, b, y;
} berth_binary_params;

/* y = x with dtype conversion (f32 <-> bf16/f16) and arbitrary outer strides on both sides; same ne. */
typedef struct berth_copy_params {
    uint32_t struct_size;
    berth_tensor x, y;
} berth_copy_params;

/* ---------------------------------------------------------------------------------------------------------------
 * Paged KV cache.
 *
 * The host owns the KV memory layout; it passes it to every KV op as a berth_kv_view. A pool holds n_blocks
 * blocks of block_size token slots. The K vector of (block b, slot s, kv head h) of the viewed layer starts at
 *     k_buf + k_offset + b*block_stride + s*token_stride + h*head_stride
 * and holds head_dim elements of dtype; the V vector starts at
 *     v_buf + v_offset + b*block_stride + s*v_token_stride + h*v_head_stride
 * and holds head_dim_v elements, so K and V of different widths each take only their own size. A sequence's key
 * at absolute position p lives in block block_table[p / block_size], slot p % block_size. Frozen value type
 * (its layout changed in ABI 0.2: the V strides were added). */
typedef struct berth_kv_view {
    berth_buffer *k_buf;
    berth_buffer *v_buf;
    uint64_t k_offset;
    uint64_t v_offset;
    uint64_t block_stride;   /* K and V */
    uint64_t token_stride;   /* K */
    uint64_t head_stride;    /* K */
    uint64_t v_token_stride; /* V */
    uint64_t v_head_stride;  /* V */
    berth_dtype dtype;
    int32_t block_size;
    int32_t n_blocks;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t head_dim_v;
} berth_kv_view;

/* Write K and V of T new tokens into the cache.
 * k: ne {head_dim, n_kv_heads, T}; v: ne {head_dim_v, n_kv_heads, T} (views allowed; f32 or an act dtype).
 * slots: ne {T} i32, slot index = block*block_size + offset within the pool; a negative slot skips the token.
 * Before storing, optionally (in this order, fp32):
 *   K: RMS norm per head over head_dim as k_norm_mode says, then RoPE (rope_n_pairs > 0: positions ne {T} i32,
 *      rope_freqs ne {rope_n_pairs} f32, mode/pair_offset as in ROPE);
 *   V: RMS norm per head over head_dim_v as v_norm_mode says (V is never rotated).
 * Norm modes here: BERTH_NORM_W_NONE (0) = NO NORM AT ALL, the vector is stored as given; BERTH_NORM_UNIT =
 * x / sqrt(mean(x^2) + eps) without a weight; BERTH_NORM_W / W_ONE_PLUS = that times w / (1 + w), with the
 * weight k_norm ne {head_dim} / v_norm ne {head_dim_v} (any weight dtype; read only in these two modes).
 * With both modes W_NONE and rope_n_pairs 0 this is a plain scatter into the pages. */
typedef struct berth_kv_append_params {
    uint32_t struct_size;
    int32_t k_norm_mode;
    int32_t v_norm_mode;
    float eps;
    int32_t rope_mode;
    int32_t rope_pair_offset;
    int32_t rope_n_pairs;
    int32_t reserved0;
    berth_tensor k, v, slots, k_norm, v_norm, positions, rope_freqs;
    berth_kv_view kv;
    /* ABI 0.4: fields above. Appended in ABI 0.5, optional (absent: q.buf NULL; in supports() queries q.ne[0] ==
     * 0): the layer's queries q (ne {head_dim, n_q_heads, T}, f32, rows may be strided; its own buffer range,
     * overlapping none of the other tensors), normalised per head as q_norm_mode says (weight q_norm ne
     * {head_dim}; W_NONE: no norm) and then rotated with K's rope_* and positions, IN PLACE: exactly what an
     * rms_norm with the same weight, eps and RoPE would write over q. One launch for a decode step's q-norm +
     * RoPE and its K/V store instead of two (Gemma 4, Qwen3.5's full attention). */
    int32_t q_norm_mode;
    int32_t reserved1;
    berth_tensor q, q_norm;
    /* ABI 0.5: fields above. Append below only. */
} berth_kv_append_params;

/* Mask kinds for ATTENTION. */
#define BERTH_MASK_CAUSAL 0 /* query at position p sees keys at s <= p (and s > p - window when window > 0) */
#define BERTH_MASK_NONE 1   /* every key of the sequence (encoder self-attention, cross-attention); no window */

/* Attention of a batch of sequences over the paged cache (prefill chunks and decode rows mixed).
 * q: ne {head_dim, n_heads, T} (f32 or act dtype); out: ne {head_dim_v, n_heads, T}.
 * Sequence i owns query rows [seq_q_start[i], seq_q_start[i+1]) (seq_q_start ne {n_seqs+1} i32) and has
 * seq_kv_len[i] keys (ne {n_seqs} i32) at positions 0..seq_kv_len[i]-1, stored through row i of block_table
 * (ne {max_blocks, n_seqs} i32). positions (ne {T} i32) gives each query row's absolute position.
 * score(h, s) = scale * q_h . k_{h / (n_heads/n_kv_heads)}(s), then softcap (if > 0: c*tanh(score/c)), then mask
 * (causal with optional sliding window: a query at p sees keys with p - window < s <= p, i.e. at most `window`
 * keys including its own position), softmax in fp32, out_h = sum_s p(h, s) v(s).
 * gate (optional, ne like out): out *= sigmoid(gate) (Qwen3.5 gated attention).
 * Edge cases, fixed so every backend agrees:
 *   - seq_q_start is non-decreasing from seq_q_start[0] = 0 to seq_q_start[n_seqs] = T (a sequence may have no
 *     query rows); T > 0 with n_seqs = 0, or any other seq_q_start, is BERTH_E_INVALID at execution;
 *   - a query only sees keys s < seq_kv_len[i]; a query row that sees no key at all (seq_kv_len 0, or a window
 *     that ends before the first key) outputs zeros (after the gate too);
 *   - window > 0 with BERTH_MASK_NONE is unsupported: supports() answers BERTH_E_UNSUPPORTED;
 *   - seq_kv_len[i] must fit the block table's row (<= max_blocks * block_size), else BERTH_E_INVALID.
 * Block-table entries of blocks that no query can see (wholly outside every window) may be negative.
 * max_q_len / max_kv_len are upper bounds over the batch (host-side, for launch sizing). */
typedef struct berth_attention_params {
    uint32_t struct_size;
    int32_t mask;
    int32_t window; /* 0 = no window */
    float scale;
    float softcap;  /* 0 = none */
    int32_t n_seqs;
    int32_t max_q_len;
    int32_t max_kv_len;
    berth_tensor q, out, gate, positions, seq_q_start, seq_kv_len, block_table;
    berth_kv_view kv;
} berth_attention_params;

/* ---------------------------------------------------------------------------------------------------------------
 * Recurrent ops (Gated DeltaNet, Qwen3.5). Per-sequence state lives in host-managed state pools: a pool tensor
 * whose outermost dimension is the slot; state_slots (ne {n_seqs} i32) picks each sequence's slot. A fresh
 * sequence's slot is zeroed by the host before its first step. */

/* Depthwise causal conv1d over time with carried state, per sequence.
 * x: ne {C, T}; w: ne {K, C} (kernel width K); bias ne {C} or absent; y: ne {C, T};
 * state: ne {K-1, C, n_slots} f32 (the last K-1 inputs, oldest first), updated in place.
 * y[t, c] = act(bias[c] + sum_{j<K} w[c, j] * xx[t + j - (K-1), c]) where xx prepends the state to x. */
typedef struct berth_conv1d_causal_params {
    uint32_t struct_size;
    int32_t act;
    int32_t n_seqs;
    berth_tensor x, w, bias, y, state, state_slots, seq_q_start;
} berth_conv1d_causal_params;

/* Gated delta rule (Gated DeltaNet), per sequence and value head:
 *   q, k: ne {d_k, n_k_heads, T}; v: ne {d_v, n_v_heads, T}; g: ne {n_v_heads, T} (log decay);
 *   beta: ne {n_v_heads, T} (already sigmoid'ed); out: ne {d_v, n_v_heads, T};
 *   state: ne {d_v, d_k, n_v_heads, n_slots} f32, updated in place. Per head S is ne {d_v, d_k}: the d_k x d_v
 *   matrix S[i][j] (row i = key dim) stored row by row, d_v contiguous floats per key row — the layout Hugging
 *   Face keeps ([slot][head][d_k][d_v]).
 * q/k head of value head h is h / (n_v_heads / n_k_heads). If qk_l2norm, q and k are L2-normalised per head
 * (x / sqrt(sum x^2 + 1e-6)) first; q is then multiplied by scale. Recurrence for each token:
 *   S = exp(g) S;  S += beta * k (v - S^T k)^T;  out = S^T q
 * chunk_size is a hint: > 0 suggests the chunked (WY) form with that chunk length, 0 token by token. A backend
 * may ignore it and always evaluate the recurrence (the CPU backend does): both forms are equal up to rounding. */
typedef struct berth_gated_delta_params {
    uint32_t struct_size;
    int32_t qk_l2norm;
    float scale;
    int32_t chunk_size;
    int32_t n_seqs;
    berth_tensor q, k, v, g, beta, out, state, state_slots, seq_q_start;
} berth_gated_delta_params;

/* y = rmsnorm(x) * w * f(z) over ne[0] (Qwen3.5 GDN output norm: f = SiLU). x, z, y same shape; w ne {ne0}. */
typedef struct berth_gated_rms_norm_params {
    uint32_t struct_size;
    int32_t act;
    float eps;
    berth_tensor x, z, w, y;
} berth_gated_rms_norm_params;

/* Beam search helper: per row r, s = log_softmax(logits[r]) + row_bias[r] (row_bias ne {R} f32 or absent);
 * writes the k largest s in descending order (ties: lower index first) to values ne {k, R} f32 and their
 * indices to indices ne {k, R} i32. logits ne {V, R} f32. */
typedef struct berth_log_softmax_topk_params {
    uint32_t struct_size;
    int32_t k;
    berth_tensor logits, row_bias, values, indices;
} berth_log_softmax_topk_params;

/* Sampling, one token per row of logits (ne {V, R} f32). Per-row parameters are host arrays of R entries:
 *  temperature (<= 0 means greedy argmax, ties to the lower id), top_k (<= 0: off), top_p (>= 1: off),
 *  min_p (<= 0: off), repetition/presence/frequency penalties (1/0/0: off) applied over the row's history ids
 *  (history ne {n_hist} i32 and history_start ne {R+1} i32 on the host), seed and counter for a
 *  counter-based generator: the uniform draw of a row depends only on (seed, counter).
 * history_output_start (ABI 0.3, appended; read only when struct_size covers it): R host entries, per row the
 *  index into history (absolute, within [history_start[r], history_start[r+1]]) where the row's generated tokens
 *  begin. Repetition counts every history id of the row (prompt + output); presence and frequency count only the
 *  ids at or after history_output_start[r] (vLLM / OpenAI semantics). A value outside the row's range, or the
 *  array without history_start, is BERTH_E_INVALID. NULL (or an older caller): the whole history is output, so
 *  all three penalties count every id (the behaviour before 0.3).
 * A NULL per-row array means "off" for every row: temperature NULL = greedy, top_k/top_p/min_p NULL = no
 * filter, penalty arrays NULL = no penalty, seed/counter NULL = 0.
 * Per row, exactly (so every backend draws the same token up to rounding of the probabilities):
 *  1. z = logits; for each distinct history id, with c its count over the row's whole history and o its count
 *     over the output part (o = c without history_output_start): repetition r divides a positive z by r and
 *     multiplies a negative one by r (c > 0); then, only when o > 0, z -= presence, then z -= frequency * o.
 *  2. temperature <= 0: the id of the largest z (ties: lower id); skip to the outputs. Else w = z / temperature.
 *  3. top-k (0 < k < V): keep the k largest w (ties: lower id).
 *  4. softmax over the kept ids (fp32 exponentials of w - max, the sum accumulated in double).
 *  5. top-p (< 1): order the kept ids by probability, descending (ties: lower id); keep the shortest prefix
 *     whose cumulative probability (double) reaches top_p, at least one id.
 *  6. min-p (> 0): keep ids whose probability is >= min_p * (the largest probability).
 *  7. draw: (r0, r1, r2, r3) = Philox-4x32-10 (Salmon et al. 2011; multipliers 0xD2511F53, 0xCD9E8D57, key
 *     increments 0x9E3779B9, 0xBB67AE85) of counter words (counter & 0xffffffff, counter >> 32, 0, 0) under
 *     key words (seed & 0xffffffff, seed >> 32); u = (((uint64)r0 << 32 | r1) >> 11) * 2^-53, in [0, 1).
 *     Walk the surviving ids in INCREASING ID ORDER, summing their probabilities (double); the chosen id is the
 *     first where the sum exceeds u * (sum over all survivors), or the last survivor if rounding leaves none.
 * Outputs: ids ne {R} i32; logprob ne {R} f32 (log-softmax of the penalised, temperature-free logits z at the
 * chosen id; absent = not wanted); top_ids/top_logprobs ne {n_top, R}: the n_top largest z (ties: lower id),
 * best first, with their log-softmax (unused when n_top = 0). */
typedef struct berth_sample_params {
    uint32_t struct_size;
    int32_t n_rows;
    int32_t n_top;
    int32_t reserved0;
    const float *temperature;
    const int32_t *top_k;
    const float *top_p;
    const float *min_p;
    const float *repetition_penalty;
    const float *presence_penalty;
    const float *frequency_penalty;
    const uint64_t *seed;
    const uint64_t *counter;
    const int32_t *history;       /* may be NULL when no penalties are used */
    const int32_t *history_start; /* R+1 offsets into history */
    berth_tensor logits, ids, logprob, top_ids, top_logprobs;
    /* ABI 0.2: fields above. Appended in ABI 0.3 (see above; an older caller's struct stops short of it): */
    const int32_t *history_output_start; /* R absolute indices into history: where each row's output begins */
    /* ABI 0.3: fields above. Append below only. */
} berth_sample_params;

/* ---------------------------------------------------------------------------------------------------------------
 * The op table. A NULL member means "not supported". Append-only within a major. Each call enqueues on stream
 * (or runs at once) and returns BERTH_OK, or an error with host->set_error() called. */
typedef struct berth_ops {
    uint32_t struct_size;
    berth_status (*matmul)(berth_backend *be, berth_stream *s, const berth_matmul_params *p);
    berth_status (*get_rows)(berth_backend *be, berth_stream *s, const berth_get_rows_params *p);
    berth_status (*rms_norm)(berth_backend *be, berth_stream *s, const berth_rms_norm_params *p);
    berth_status (*layer_norm)(berth_backend *be, berth_stream *s, const berth_layer_norm_params *p);
    berth_status (*rope)(berth_backend *be, berth_stream *s, const berth_rope_params *p);
    berth_status (*unary)(berth_backend *be, berth_stream *s, const berth_unary_params *p);
    berth_status (*glu)(berth_backend *be, berth_stream *s, const berth_glu_params *p);
    berth_status (*binary)(berth_backend *be, berth_stream *s, const berth_binary_params *p);
    berth_status (*copy)(berth_backend *be, berth_stream *s, const berth_copy_params *p);
    berth_status (*kv_append)(berth_backend *be, berth_stream *s, const berth_kv_append_params *p);
    berth_status (*attention)(berth_backend *be, berth_stream *s, const berth_attention_params *p);
    berth_status (*conv1d_causal)(berth_backend *be, berth_stream *s, const berth_conv1d_causal_params *p);
    berth_status (*gated_delta)(berth_backend *be, berth_stream *s, const berth_gated_delta_params *p);
    berth_status (*gated_rms_norm)(berth_backend *be, berth_stream *s, const berth_gated_rms_norm_params *p);
    berth_status (*log_softmax_topk)(berth_backend *be, berth_stream *s, const berth_log_softmax_topk_params *p);
    berth_status (*sample)(berth_backend *be, berth_stream *s, const berth_sample_params *p);
    /* ABI 0.1: ops above. Append below only, in BERTH_OP_* order. */
} berth_ops;

/* ---------------------------------------------------------------------------------------------------------------
 * The backend function table (descriptor->vtable for kind BERTH_PLUGIN_BACKEND). Required members are marked;
 * the loader rejects a plugin that leaves one NULL. */
typedef struct berth_backend_vtable {
    uint32_t struct_size;

    /* (required) Cheap check for hardware: fills out (caller sets out->struct_size). Must not fail because the
     * hardware is missing: report n_devices = 0 and say why in out->message, return BERTH_OK. */
    berth_status (*probe)(const berth_host *host, berth_probe_info *out);
    /* (required) Describe device idx (0 <= idx < n_devices). */
    berth_status (*device_info)(const berth_host *host, int32_t idx, berth_device_info *out);
    /* (required) Open device idx. The host table stays valid until destroy. On failure *out is untouched and the
     * message was set. */
    berth_status (*init)(const berth_host *host, int32_t idx, berth_backend **out);
    /* (required) Release everything init and later calls created. Accepts NULL. */
    void (*destroy)(berth_backend *be);
    /* (required) Is this exact op (id + parameters; tensor buffers NULL) supported? BERTH_OK or
     * BERTH_E_UNSUPPORTED with a message. Pure, thread-safe; must agree with execution. */
    berth_status (*supports)(berth_backend *be, int32_t op, const void *params);
    /* (required) The op table; static, valid while the backend lives. */
    const berth_ops *(*get_ops)(berth_backend *be);

    /* (required) Streams. stream_sync waits for all work enqueued on s. */
    berth_status (*stream_create)(berth_backend *be, berth_stream **out);
    void (*stream_destroy)(berth_backend *be, berth_stream *s);
    berth_status (*stream_sync)(berth_backend *be, berth_stream *s);

    /* (required) Buffers. Contents of a new buffer are undefined. free accepts NULL. */
    berth_status (*buffer_alloc)(berth_backend *be, uint64_t nbytes, int32_t usage, berth_buffer **out);
    void (*buffer_free)(berth_backend *be, berth_buffer *buf);
    /* (optional, BERTH_CAP_WRAP_HOST) Use caller memory as a buffer without copying. The caller keeps the memory
     * alive and unchanged until buffer_free; read_only says the backend must never write it. */
    berth_status (*buffer_wrap_host)(berth_backend *be, void *ptr, uint64_t nbytes, int32_t read_only,
                                     berth_buffer **out);
    /* (optional) Host address of a buffer's first byte: for every buffer with BERTH_CAP_HOST_VISIBLE; without that
     * cap a backend may still set this member for BERTH_USAGE_STAGING buffers (pinned host memory) and refuse the
     * rest with BERTH_E_UNSUPPORTED (0.3). The host writes staging memory directly and moves it with buffer_copy,
     * which on an ASYNC backend returns before the copy ran: the memory must stay unchanged until a stream_sync. */
    berth_status (*buffer_host_ptr)(berth_backend *be, berth_buffer *buf, void **out);
    /* (required) Transfers, ordered on stream s. upload reads src before returning unless the backend is ASYNC
     * and src is staging memory; download's dst is written by the time stream_sync returns. buffer_copy's two
     * ranges must not overlap (a backend may copy in any order). */
    berth_status (*buffer_upload)(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                  const void *src, uint64_t nbytes);
    berth_status (*buffer_download)(berth_backend *be, berth_stream *s, const berth_buffer *src, uint64_t offset,
                                    void *dst, uint64_t nbytes);
    berth_status (*buffer_copy)(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t dst_offset,
                                const berth_buffer *src, uint64_t src_offset, uint64_t nbytes);
    berth_status (*buffer_fill)(berth_backend *be, berth_stream *s, berth_buffer *dst, uint64_t offset,
                                uint8_t byte, uint64_t nbytes);
    /* ABI 0.1: fields above. */

    /* (optional, BERTH_CAP_GRAPHS) Graphs: record the ops enqueued on s between graph_begin and graph_end
     * instead of running them, then replay the recording with graph_launch as often as wanted. A replay does
     * exactly what the recorded calls did, with the same parameters and the same buffers: to run a new step
     * through a graph, the caller rewrites the CONTENTS of those buffers (token ids, positions, block tables,
     * lengths) and launches it. Between begin and end no call on this backend may synchronise or transfer to or
     * from host memory (stream_sync, buffer_upload/download, sample); a failing op aborts the recording
     * (graph_end then fails, and the stream is usable again). Ops record launch sizes from shapes and fixed
     * bounds only (e.g. attention from the block table's width, not max_kv_len), so any contents valid for
     * those shapes replay correctly. graph_end's *out is destroyed by the caller with graph_destroy. (ABI 0.3) */
    berth_status (*graph_begin)(berth_backend *be, berth_stream *s);
    berth_status (*graph_end)(berth_backend *be, berth_stream *s, berth_graph **out);
    berth_status (*graph_launch)(berth_backend *be, berth_stream *s, berth_graph *g);
    void (*graph_destroy)(berth_backend *be, berth_graph *g);
    /* (optional, BERTH_CAP_ASYNC backends; all four or none, 0.3) Events: event_record marks the point in s's
     * order after everything enqueued on s so far; event_sync waits for exactly that work — not for work enqueued
     * later — so the host can read one step's results while the next step runs. Recording an event again moves
     * its mark. event_sync on an event never recorded returns at once. A synchronous backend (no
     * BERTH_CAP_ASYNC) leaves them NULL: its work is done when each call returns. event_destroy accepts NULL. */
    berth_status (*event_create)(berth_backend *be, berth_event **out);
    void (*event_destroy)(berth_backend *be, berth_event *e);
    berth_status (*event_record)(berth_backend *be, berth_stream *s, berth_event *e);
    berth_status (*event_sync)(berth_backend *be, berth_event *e);
    /* ABI 0.3: fields above. Append below only. */
} berth_backend_vtable;

/* What the host hands a model plugin so it can drive the chosen backend. Valid until the model is destroyed. */
typedef struct berth_backend_api {
    uint32_t struct_size;
    int32_t device_index;
    const berth_backend_vtable *vt;
    const berth_ops *ops;
    berth_backend *be;
    const berth_device_info *device; /* the chosen device */
    /* ABI 0.1: fields above. Append below only. */
} berth_backend_api;

#ifdef __cplusplus
}
#endif
#endif /* BERTH_BACKEND_H */

/*
 * runner.h — drives one loaded model plugin on one backend: loads it, owns the paged KV cache, the per-step
 * metadata buffers and the logits buffer, builds berth_batch steps, and runs prefill (chunked), decode and
 * sampled generation. Every step publishes its blocks to the KV cache's prefix cache.
 *
 * A step may mix several sequences (n_seqs >= 1, prefill chunks and decode rows alike); prefill/decode/generate
 * below are the single-sequence conveniences `berth generate` and the parity tests use. The scheduler grows on
 * runner_step.
 *
 * Ownership: the runner borrows the backend api, the model and the checkpoint; it owns what it allocates on the
 * backend (KV pools, metadata and logits buffers, its stream). Free it before destroying the model, closing the
 * checkpoint, or destroying the backend. Single-threaded.
 */
#ifndef BERTH_HOST_RUNNER_H
#define BERTH_HOST_RUNNER_H

#include <berth/model.h>
#include <stdint.h>

#include "kv_cache.h"

struct runner;

struct runner_config {
    const berth_backend_api *be;      /* the chosen, initialised backend */
    const berth_model_vtable *mvt;    /* the model plugin's table */
    berth_model *model;               /* created, not yet loaded: runner_create calls load() */
    const berth_checkpoint *ck;
    const char *model_dir;            /* for messages ("DIR/config.json") */
    int32_t max_batch_tokens;         /* [scheduler] max_batch_tokens: most tokens per forward() */
    int32_t max_seqs;                 /* sequences alive at once (1 for `berth generate`) */
    int32_t kv_block_size;            /* [kv] block_size */
    uint64_t kv_memory;               /* [kv] memory */
    int32_t kv_dtype;                 /* [kv] dtype: BERTH_DTYPE_F32 (0, also what a zeroed config asks for), BF16,
                                       * F16, or -1 = the backend's preferred_kv_dtype */
    int32_t state_snapshots;          /* state-snapshot slots for prefix caching of recurrent models (0: none) */
    int32_t no_graphs;                /* 1: never replay decode steps as backend graphs ([scheduler] graphs = false) */
    int32_t overlap;                  /* [scheduler] overlap: 0 auto, 1 true, -1 false (runner.h, "Overlap") */
};

/* Load the model (berth_load_params: act F32, KV as cfg->kv_dtype resolves), size the KV cache, create a stream and the metadata and
 * logits buffers. Caller frees with runner_free. */
berth_status runner_create(const struct runner_config *cfg, struct runner **out);
void runner_free(struct runner *r);

const berth_model_info *runner_info(const struct runner *r);
struct kv_cache *runner_kv(struct runner *r);
int32_t runner_max_batch_tokens(const struct runner *r);
int32_t runner_max_seqs(const struct runner *r);

/* Check a prompt before any work: every id in [0, vocab), prompt non-empty, and prompt + max_new within the
 * context limit. Messages:
 *   token id 300 at prompt position 4 is outside the vocabulary (size 256)
 *   prompt of 300 tokens + 24 new tokens exceeds the context limit of 256 (max_position_embeddings in DIR/config.json)
 */
berth_status runner_check_prompt(const berth_model_info *info, const char *model_dir, const int32_t *ids,
                                 int32_t n, int32_t max_new);

/* Sequences: a fresh one (length 0, recurrent state zeroed) and its release. */
berth_status runner_seq_new(struct runner *r, int32_t *seq);
void runner_seq_free(struct runner *r, int32_t seq);
int32_t runner_seq_len(const struct runner *r, int32_t seq);
/* A new sequence sharing src's blocks (copy-on-write of the last partial one) and state (kv_seq_fork). */
berth_status runner_seq_fork(struct runner *r, int32_t src, int32_t *dst);
/* Give the empty seq the longest cached prefix of ids[0..n) (kv_prefix_attach); *cached tokens need no compute. */
berth_status runner_seq_attach_prefix(struct runner *r, int32_t seq, const int32_t *ids, int32_t n, int32_t *cached);
/* Free a sequence whose attach served `cached` tokens but which never ran (admission rolled back), taking those
 * tokens back out of the counters. */
void runner_seq_abandon(struct runner *r, int32_t seq, int32_t cached);

/* One sequence's part of a step. */
#define RUNNER_LOGITS_NONE 0
#define RUNNER_LOGITS_LAST 1
#define RUNNER_LOGITS_ALL 2
struct runner_seq_step {
    int32_t seq;
    const int32_t *ids;   /* n new tokens, appended at positions [len, len + n); NULL: fed (see "Overlap") */
    int32_t n;
    int32_t logits;       /* RUNNER_LOGITS_*: which of its rows get logits */
    int32_t is_decode;    /* counts as a decode step (else as n prefill tokens) */
    int32_t feed_row;     /* ids == NULL: the one token is row feed_row of the last runner_sample_launch */
};

/* One forward() over the given sequences (total tokens <= max_batch_tokens, one entry per distinct sequence).
 * Logit rows land in the runner's logits buffer in batch order (sequence by sequence, ascending); fetch them
 * with runner_logits / runner_sample_row. On failure the sequences involved must be freed. */
berth_status runner_step(struct runner *r, const struct runner_seq_step *steps, int32_t n_seqs);
/* Rows of the last step's logits: copy n_rows x vocab floats starting at row first into dst (syncs). */
berth_status runner_logits(struct runner *r, int32_t first, int32_t n_rows, float *dst);
/* Logit rows the last step produced. */
int32_t runner_n_logits(const struct runner *r);

/* Prefill ids into seq, splitting into chunks of at most max_batch_tokens (chunked prefill). logits_out (may be
 * NULL) receives [n x vocab] floats with want_all_logits, else the last row [vocab]. Afterwards the last row's
 * logits stay available to runner_sample_row(r, runner_n_logits(r) - 1, ...). */
berth_status runner_prefill(struct runner *r, int32_t seq, const int32_t *ids, int32_t n, int want_all_logits,
                            float *logits_out);
/* Append one token to seq; logits_out (may be NULL) receives its [vocab] logits. */
berth_status runner_decode(struct runner *r, int32_t seq, int32_t token, float *logits_out);

/* Most top logprobs one row may ask for (as vLLM's default max_logprobs). */
#define RUNNER_MAX_TOP_LOGPROBS 20

/* A zero-initialised tail is "off": repetition_penalty 0 counts as 1. The penalties count the ids in history
 * (which ids that is — prompt and/or generated — is the caller's choice; the scheduler's is in scheduler.h); the
 * first n_history_prompt of them are the prompt, which only the repetition penalty counts (vLLM / OpenAI: presence
 * and frequency count generated tokens only; the sample op's history_output_start). */
struct runner_sampling {
    float temperature; /* <= 0: greedy */
    int32_t top_k;     /* <= 0: off */
    float top_p;       /* >= 1: off */
    uint64_t seed;
    float min_p;                 /* <= 0: off */
    float repetition_penalty;    /* 1 (or 0): off; > 0 */
    float presence_penalty;      /* 0: off */
    float frequency_penalty;     /* 0: off */
    const int32_t *history;      /* n_history ids the penalties count (borrowed for the call) */
    int32_t n_history;
    int32_t n_top;               /* top logprobs wanted, 0..RUNNER_MAX_TOP_LOGPROBS */
    int32_t n_history_prompt;    /* 0..n_history: leading history ids that are prompt, not generated (0: none) */
};

/* Whether sp sets any penalty (repetition != 1 or 0, presence or frequency != 0): only then is its history read. */
int runner_sampling_uses_penalties(const struct runner_sampling *sp);

/* Per row: the log-softmax of the penalised, temperature-free logits at the chosen id and at the n_top best ids
 * (best first, ties to the lower id), as the backend's sample op defines them. */
struct runner_sample_out {
    float logprob;
    int32_t n_top;
    int32_t top_ids[RUNNER_MAX_TOP_LOGPROBS];
    float top_logprobs[RUNNER_MAX_TOP_LOGPROBS];
};

/* Sample one token from row `row` of the last step's logits with the backend's sample op (greedy when
 * temperature <= 0); counter feeds the counter-based generator (the position the token will take). */
berth_status runner_sample_row(struct runner *r, int32_t row, const struct runner_sampling *sp, uint64_t counter,
                               int32_t *id);
/* Rows [first, first + n_rows) of the last step's logits in one sample call (n_rows <= max_seqs): row i with
 * sp[i] and counters[i] into ids[i]. */
berth_status runner_sample_rows(struct runner *r, int32_t first, int32_t n_rows, const struct runner_sampling *sp,
                                const uint64_t *counters, int32_t *ids);
/* As runner_sample_rows, and out[i] (out may be NULL) receives row i's logprobs. Backends without a sample op
 * support greedy rows without penalties or logprobs only. */
berth_status runner_sample_rows_lp(struct runner *r, int32_t first, int32_t n_rows, const struct runner_sampling *sp,
                                   const uint64_t *counters, int32_t *ids, struct runner_sample_out *out);

/* Overlap: the host prepares and enqueues step N+1 while step N still runs.
 *   runner_sample_launch(slot) enqueues the sample op over the last step's logit rows and the copies of its
 *   outputs, without waiting; runner_sample_collect(slot) waits for exactly that work (a backend event) and reads
 *   them. A following runner_step may take a row's token straight from the device (ids NULL, feed_row = the row
 *   of the latest launch): it never passes through the host, and the step goes out with h_tokens NULL, so the
 *   model must say it takes that (berth_model_info.h_tokens_optional). The caller publishes a fed token to the
 *   prefix cache (runner_seq_publish) once it has collected it. runner_can_feed says whether feeding works:
 *   [scheduler] overlap = auto (asynchronous backends with events and pinned staging memory), true (also
 *   synchronous ones, where it overlaps nothing: tests), false (never). Slots 0 and 1 are the caller's, one per
 *   step in flight; runner_sample_rows* use RUNNER_SLOT_NOW. */
#define RUNNER_SAMPLE_SLOTS 3
#define RUNNER_SLOT_NOW 2
int runner_can_feed(const struct runner *r);
/* want_lp: fill runner_sample_out at collect (each row's sp.n_top best too). */
berth_status runner_sample_launch(struct runner *r, int slot, int32_t first, int32_t n_rows,
                                  const struct runner_sampling *sp, const uint64_t *counters, int want_lp);
/* ids[n_rows] of the launch; out (may be NULL) receives the logprobs when the launch wanted them. */
berth_status runner_sample_collect(struct runner *r, int slot, int32_t *ids, struct runner_sample_out *out);
/* Record tokens of seq at [start, start + n) for the prefix cache (kv_seq_publish), for fed rows. */
berth_status runner_seq_publish(struct runner *r, int32_t seq, int32_t start, const int32_t *ids, int32_t n);

#define RUNNER_FINISH_LENGTH "length"
#define RUNNER_FINISH_STOP "stop"
struct runner_generation {
    int32_t *tokens;           /* generated ids; caller frees */
    int32_t n_tokens;
    const char *finish_reason; /* RUNNER_FINISH_*: EOS id of the model ("stop") or max_new reached ("length") */
    int32_t cached_tokens;     /* prompt tokens taken from the prefix cache */
    struct runner_sample_out *logprobs; /* [n_tokens] when runner_gen_params.logprobs, else NULL; caller frees */
};

/* Called after each generated token; return non-zero to stop early (finish_reason "stop"). */
typedef int (*runner_token_fn)(int32_t token, void *arg);

struct runner_gen_params {
    int32_t max_new;                 /* tokens to generate at most */
    struct runner_sampling sampling;
    int32_t ignore_eos;              /* keep going past the model's EOS ids (references, benchmarks) */
    int32_t logprobs;                /* fill runner_generation.logprobs (sampling.n_top best per token too) */
};

/* Check the prompt, reuse its longest cached prefix (only when prompt_logits is NULL: those rows must be
 * computed), prefill the rest (all logits into prompt_logits [n x vocab] when non-NULL), then sample up to
 * max_new tokens, decoding each one but the last through the KV cache: n_tokens - 1 decode steps, no
 * re-prefill. Stops at an EOS id of the model unless ignore_eos. Penalties as vLLM applies them: repetition
 * counts the prompt and the generated ids, presence and frequency the generated ids only (sampling.history and
 * n_history_prompt are set here). Uses a fresh sequence and frees it. */
berth_status runner_generate(struct runner *r, const int32_t *prompt, int32_t n, const struct runner_gen_params *gp,
                             float *prompt_logits, runner_token_fn cb, void *arg, struct runner_generation *out);

/* Host-side counters since creation. */
struct runner_stats {
    int64_t prefill_tokens;   /* tokens run through prefill steps */
    int64_t decode_steps;     /* single-token decode steps */
    int64_t forward_calls;    /* forward() calls */
    int64_t cached_tokens;    /* prompt tokens served from the prefix cache (runner_seq_attach_prefix) */
    int64_t mixed_steps;      /* steps holding both decode rows and prefill tokens */
    int64_t graph_captures;   /* decode steps recorded as a backend graph (forward() ran in recording mode) */
    int64_t graph_replays;    /* decode steps run by replaying a recorded graph (forward() was not called) */
    double prefill_seconds;   /* wall time in prefill steps (including the logits download) */
    double decode_seconds;
    int32_t kv_peak_blocks[8]; /* most blocks in use per group (first 8 groups) */
};
const struct runner_stats *runner_stats(const struct runner *r);
/* The model plugin's own counters (its optional counters()); *n = how many, at most cap copied. 0 without. */
berth_status runner_model_counters(const struct runner *r, berth_counter *out, int32_t cap, int32_t *n);

#endif

/*
 * berth.h — the serving engine: the one interface the CLI, the benchmark and the HTTP server use.
 *
 * An engine loads one checkpoint (config -> plugins -> checkpoint -> backend + model plugin -> KV cache) and
 * serves requests on its own thread with continuous batching, chunked prefill, a prefix cache and preemption
 * by recompute. Submission never blocks on the model: requests go into a bounded queue, and when it is full
 * berth_engine_submit fails with BERTH_E_OVERLOADED instead of growing memory. Tokens stream through the
 * request's callback, which runs on the engine thread (keep it short; it must not call back into the engine
 * except berth_engine_cancel / berth_engine_get_stats).
 *
 * Thread safety: submit, hold, cancel and stats may be called from any thread. Destroy from one thread, after which
 * no callback runs.
 */
#ifndef BERTH_ENGINE_H
#define BERTH_ENGINE_H

#include <berth/plugin.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Submission refused: the engine's queue is full. Try again later. */
#define BERTH_E_OVERLOADED -100

typedef struct berth_engine berth_engine;

typedef struct berth_engine_config {
    uint32_t struct_size;
    const char *config_path;   /* the berth INI config (required) */
    const char *model_dir;     /* checkpoint folder; NULL = [model] path of the config */
    int32_t max_seqs;          /* 0 = [scheduler] max_seqs */
    int32_t max_batch_tokens;  /* 0 = [scheduler] max_batch_tokens */
    int32_t queue_capacity;    /* requests accepted but not finished, at most; 0 = 4 x max_seqs */
    int32_t reserved0;
    uint64_t kv_memory;        /* 0 = [kv] memory */
} berth_engine_config;

typedef struct berth_engine_request {
    uint32_t struct_size;
    const int32_t *prompt;     /* token ids (copied) */
    int32_t n_prompt;
    int32_t max_new_tokens;
    int32_t n;                 /* parallel samples (0 or 1: one); they share the prompt's KV blocks */
    float temperature;         /* <= 0: greedy */
    int32_t top_k;             /* <= 0: off */
    float top_p;               /* >= 1 (or 0): off */
    uint64_t seed;             /* sample k uses seed + k; a seeded request reproduces whatever shares its steps */
    int32_t ignore_eos;        /* do not stop at the checkpoint's EOS ids */
    int32_t n_stop_ids;
    const int32_t *stop_ids;   /* stop after generating any of these (copied) */
    /* Fields below are read only when struct_size covers them (zero = off). */
    float min_p;               /* <= 0: off; keep ids with probability >= min_p x the best one's */
    float repetition_penalty;  /* 0 or 1: off; > 1 discourages ids already in the prompt or the output */
    float presence_penalty;    /* 0: off; subtracted once from the logit of every id already generated */
    float frequency_penalty;   /* 0: off; subtracted per occurrence of each id already generated */
    /* Which ids the penalties count (vLLM / OpenAI): repetition the prompt + the generated ids, presence and
     * frequency the generated ids only. */
    int32_t logprobs;          /* non-zero: TOKEN events carry the token's logprob ... */
    int32_t top_logprobs;      /* ... and the top_logprobs (0..20) most likely ids with theirs */
    int32_t n_stop_strings;
    const char *const *stop_strings; /* (copied) stop when the sample's detokenized text contains one; the DONE
                                      * text ends before it (the stop string excluded), finish_reason "stop"; the
                                      * checkpoint must have a tokenizer.json. Token counts include the token that
                                      * completed the stop string. */
} berth_engine_request;

/* Most top logprobs a request may ask for. */
#define BERTH_MAX_TOP_LOGPROBS 20

#define BERTH_EVENT_TOKEN 0
#define BERTH_EVENT_DONE 1

typedef struct berth_engine_event {
    int32_t kind;              /* BERTH_EVENT_* */
    int32_t index;             /* sample index, 0..n-1 */
    int64_t request_id;
    int32_t token;             /* TOKEN: the id */
    int32_t n_tokens;          /* DONE: tokens generated */
    int32_t cached_tokens;     /* DONE: prompt tokens served from the prefix cache */
    berth_status status;       /* DONE: BERTH_OK unless finish_reason is "error" */
    const char *finish_reason; /* DONE: "stop", "length", "cancelled", "error" */
    const char *message;       /* DONE with an error: one line */
    /* TOKEN, when the request asked for logprobs: log-softmax of the (penalised, temperature-free) logits at the
     * token, and the n_top best ids, best first (arrays valid during the call). has_logprob = 0 otherwise. */
    int32_t has_logprob;
    float logprob;
    int32_t n_top;
    const int32_t *top_ids;
    const float *top_logprobs;
    /* DONE: the sample's generated text (special tokens skipped), cut before a matched stop string; NULL when the
     * checkpoint has no tokenizer.json. */
    const char *text;
} berth_engine_event;

/* Called on the engine thread; the event is valid only during the call. */
typedef void (*berth_engine_event_fn)(void *arg, const berth_engine_event *ev);

typedef struct berth_engine_stats {
    uint32_t struct_size;
    int32_t running, waiting;  /* requests now */
    int64_t steps;             /* forward calls */
    int64_t prefill_tokens;    /* prompt tokens computed by prefill chunks for the first time */
    int64_t recomputed_tokens; /* tokens computed again after a preemption (not in prefill_tokens) */
    int64_t cached_tokens;     /* prompt tokens served from the prefix cache */
    int64_t decode_rows;
    int64_t mixed_steps;       /* steps with both prefill tokens and decode rows */
    int64_t preemptions;
    int64_t forks;
    int64_t finished, cancelled, failed, rejected;
    int32_t n_pools;           /* KV page groups (first 8 reported below) */
    int32_t blocks_in_use[8];
    int32_t blocks_cached[8];
    int32_t blocks_total[8];
    char pool_names[8][32];
} berth_engine_stats;

/* Load the checkpoint and start the engine thread. Fails with a one-line message (berth_engine_last_error):
 * bad config, no plugin for the checkpoint, weights or [kv] memory that do not fit the device, ... Caller
 * destroys with berth_engine_destroy. */
berth_status berth_engine_create(const berth_engine_config *cfg, berth_engine **out);
/* Cancel everything still running (DONE "cancelled"), stop the thread, free it all. Accepts NULL. */
void berth_engine_destroy(berth_engine *e);

/* Queue a request. *id (may be NULL) receives its id. Bad requests fail here with a message and no callback
 * runs; BERTH_E_OVERLOADED when queue_capacity requests are already live. Otherwise cb gets every TOKEN event and
 * then one DONE event per sample. */
berth_status berth_engine_submit(berth_engine *e, const berth_engine_request *rq, berth_engine_event_fn cb,
                                 void *arg, int64_t *id);
/* Hold (on != 0) or release (0) new submissions: while held, submitted requests are queued but not started;
 * requests already started keep running. Releasing starts everything queued together, so the scheduler plans
 * them as one batch (a caller submitting a group "at once" from one thread, as `berth bench` does, would
 * otherwise race the engine thread, which starts a step as soon as the first request arrives). A held request
 * can be cancelled. */
void berth_engine_hold(berth_engine *e, int on);
/* Cancel request id: it finishes "cancelled" and its KV blocks are freed before the engine's next step.
 * BERTH_E_NOT_FOUND when no live request has that id. */
berth_status berth_engine_cancel(berth_engine *e, int64_t id);
/* Counters and pool usage as of the last completed step. */
berth_status berth_engine_get_stats(berth_engine *e, berth_engine_stats *out);
/* Vocabulary size and context limit of the loaded model. */
int32_t berth_engine_vocab_size(const berth_engine *e);
int32_t berth_engine_max_positions(const berth_engine *e);
/* The message of the last failed call on this thread ("" if none). */
const char *berth_engine_last_error(void);

#ifdef __cplusplus
}
#endif

#endif

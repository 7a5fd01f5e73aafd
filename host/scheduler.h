/*
 * scheduler.h — continuous batching over one runner: requests join and leave between steps; each step is one
 * forward over decode rows and prefill chunks under a per-step token budget ([scheduler] max_batch_tokens,
 * chunked prefill) and at most max_seqs sequences.
 *
 * Per step: running requests in arrival order each get their next tokens (1 for a decode row; a prefill chunk
 * up to the budget left), then waiting requests are admitted while a sequence slot, budget and the KV blocks they
 * can touch remain (a prompt first takes what the prefix cache holds; see "Admission"). When the KV cache cannot hold a
 * running request's next tokens, the latest-arrived other running request is preempted by recompute: its KV is
 * dropped and it goes back to the queue keeping the tokens it generated, to be prefilled again (mostly from the
 * prefix cache) and continue with the same output. A request that alone cannot fit the KV cache (prompt plus
 * max_new tokens) fails when it is added.
 *
 * Admission: a waiting request is charged, per group, the blocks it can touch from now to its end, beside this
 * step's needs of the requests planned before it. Full groups: every position up to prompt + max_new (the whole
 * sequence, so a request admitted alone never needs preemption; others' growth is still unreserved, preemption
 * handles that), plus for n > 1 each later sample's generated blocks and a copy-on-write block. Sliding groups:
 * the same, capped at kv_group_seq_cap per sample (ceil((window - 1 + max_batch_tokens) / block_size) + 1, the
 * most a sequence holds at once), less the blocks the prefix cache gave it; never less than its first chunk's.
 *
 * n > 1 samples: the request's prompt is prefilled once, then forked (kv_seq_fork: shared blocks, copy-on-write
 * of the last partial one) into n sequences sampled with seeds seed, seed + 1, ...
 *
 * Stops: the model's EOS ids (unless ignore_eos), stop ids, max_new tokens, cancellation, and on_token_ex asking
 * for it (stop strings, decided by the caller who detokenizes). Sampling: every logits row of a step in one
 * backend sample call, counter = the position the token takes, so a seeded request gives the same tokens
 * whatever else shares its steps.
 *
 * Penalty history (which ids the backend's repetition/presence/frequency penalties count), as vLLM: the
 * repetition penalty counts the prompt and the generated tokens (HF's RepetitionPenaltyLogitsProcessor counts every
 * input id too), presence and frequency the generated tokens only (OpenAI semantics). With a repetition penalty
 * the row's history is the prompt + the generated tokens, the prompt marked as such (n_history_prompt: the sample
 * op's history_output_start); without one, the generated tokens only. After preemption "generated" still means the
 * request's own output, never the recomputed prompt.
 *
 * Overlap (runner.h, [scheduler] overlap): a step's sample is launched, not waited for; the next sched_step then
 * launches the following decode step with each row's token fed on the device from that sample (when that is the
 * step the planner would make: no waiting request it could admit — its sequence slots taken —, every running
 * request decoding in it, no penalties, KV at hand) and only then collects the earlier step's tokens (callbacks,
 * stops) while the new one runs; otherwise it
 * collects first and plans as usual. Tokens therefore reach the callbacks one sched_step later; outputs are the
 * same. A request that stops on a collected token drops its row of the step in flight.
 *
 * Single-threaded: the engine thread drives it. Callbacks run inside sched_step.
 */
#ifndef BERTH_HOST_SCHEDULER_H
#define BERTH_HOST_SCHEDULER_H

#include <stdint.h>

#include "runner.h"

struct scheduler;

#define SCHED_FINISH_STOP "stop"       /* EOS or stop id */
#define SCHED_FINISH_LENGTH "length"   /* max_new reached */
#define SCHED_FINISH_CANCEL "cancelled"
#define SCHED_FINISH_ERROR "error"

struct sched_callbacks {
    /* A sampled token of sample `index` of request id. */
    void (*on_token)(void *arg, int64_t id, int32_t index, int32_t token);
    /* Sample `index` finished (finish: SCHED_FINISH_*; status and message set for "error"). Its KV is freed. */
    void (*on_done)(void *arg, int64_t id, int32_t index, const char *finish, int32_t n_tokens,
                    int32_t cached_tokens, berth_status status, const char *message);
    void *arg;
    /* When set, called instead of on_token: lp holds the token's logprobs when the request asked for them (else
     * NULL); a non-zero return finishes the sample with "stop" right after this token. */
    int (*on_token_ex)(void *arg, int64_t id, int32_t index, int32_t token, const struct runner_sample_out *lp);
};

struct sched_request {
    const int32_t *prompt;     /* copied */
    int32_t n_prompt;
    int32_t max_new;
    int32_t n;                 /* samples (1 when 0) */
    struct runner_sampling sampling; /* history is ignored (see "Penalty history"); n_top: top logprobs */
    int32_t logprobs;          /* report each token's logprob (and sampling.n_top best) to on_token_ex */
    int32_t ignore_eos;
    const int32_t *stop_ids;   /* copied */
    int32_t n_stop_ids;
};

struct sched_stats {
    int64_t steps;             /* forward calls */
    int64_t prefill_tokens;    /* prompt tokens computed for the first time */
    int64_t recomputed_tokens; /* tokens computed again after preemption (prompt or generated) */
    int64_t cached_tokens;     /* prompt tokens served from the prefix cache */
    int64_t decode_rows;       /* single-token decode rows */
    int64_t mixed_steps;       /* steps with both decode rows and prefill tokens */
    int64_t preemptions;
    int64_t forks;
    int64_t chained_steps;     /* steps launched before the previous step's tokens were read (overlap) */
    int64_t finished, cancelled, failed;
    int32_t running, waiting;  /* now */
};

/* cb is copied. The runner must have been created with max_seqs >= 1; the scheduler borrows it. */
berth_status sched_create(struct runner *r, const struct sched_callbacks *cb, struct scheduler **out);
void sched_free(struct scheduler *s);

/* Queue a request under the caller's id (unique among live requests). Checks the prompt and that the request
 * alone fits the KV cache and the sequence slots; on failure nothing is queued and no callback runs. */
berth_status sched_add(struct scheduler *s, int64_t id, const struct sched_request *rq);
/* Finish every sample of request id with "cancelled" (on_done runs now) and free its KV at once. BERTH_E_INVALID
 * when no live request has that id. */
berth_status sched_cancel(struct scheduler *s, int64_t id);
/* One forward step (admitting, preempting, sampling, finishing as needed). *did_work = 0 when nothing was
 * runnable. A failing forward fails the requests in the step (on_done "error") and returns BERTH_OK so the
 * engine keeps serving the rest. */
berth_status sched_step(struct scheduler *s, int *did_work);
/* Requests queued or running. */
int32_t sched_pending(const struct scheduler *s);
const struct sched_stats *sched_stats(const struct scheduler *s);

#endif

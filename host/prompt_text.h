/*
 * prompt_text.h — text in and text out for the commands that run a model (`berth generate --prompt`, `berth chat`,
 * `berth tokenize`): the checkpoint's own tokenizer.json turns text into ids, and a streaming detokenizer turns
 * generated ids back into text as they come.
 */
#ifndef BERTH_HOST_PROMPT_TEXT_H
#define BERTH_HOST_PROMPT_TEXT_H

#include <stdio.h>
#include <stdint.h>

#include "tokenizer.h"

/* Load DIR/tokenizer.json (and DIR/tokenizer_config.json when present). With required == 0 a missing
 * tokenizer.json is not an error: *out = NULL. Message: "DIR/tokenizer.json: ..." from tok_load, or
 * "DIR/tokenizer.json: not found; text prompts need the checkpoint's tokenizer". Caller frees with tok_free. */
berth_status prompt_tokenizer_open(const char *model_dir, int required, berth_tokenizer **out);

/* Encode text with the post-processor's special tokens (BOS), as transformers' tokenizer(text) does. An empty
 * encoding fails ("the prompt encodes to no tokens"). *ids: caller frees. */
berth_status prompt_encode(berth_tokenizer *t, const char *text, int add_special, int32_t **ids, int32_t *n);

/* Collects generated ids as text through a streaming detokenizer (skip_special: special tokens such as <eos> are
 * left out of the text), optionally echoing each final piece to a FILE as it arrives. */
struct prompt_stream;
/* echo may be NULL. The stream borrows t. Caller frees with prompt_stream_free. */
berth_status prompt_stream_new(const berth_tokenizer *t, FILE *echo, struct prompt_stream **out);
/* A runner_token_fn: pushes token; never stops generation (a failure is kept for prompt_stream_finish). */
int prompt_stream_on_token(int32_t token, void *arg);
/* Flush the detokenizer; *text (borrowed, valid until free or the next reset) is everything collected. Fails with
 * the first push error (e.g. a generated id outside the tokenizer's vocabulary). */
berth_status prompt_stream_finish(struct prompt_stream *s, const char **text, size_t *len);
/* Start a fresh text (a new chat turn). */
berth_status prompt_stream_reset(struct prompt_stream *s);
void prompt_stream_free(struct prompt_stream *s);

#endif

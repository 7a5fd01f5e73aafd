/*
 * commands.h — the `berth` subcommands main.c dispatches to.
 *
 * Each gets the arguments from the subcommand's own name on (argv[0] = "plugins", "generate", ...) and returns
 * the process exit status: 0 success, 1 a fatal error (already printed as one line on stderr), 2 bad usage.
 */
#ifndef BERTH_HOST_COMMANDS_H
#define BERTH_HOST_COMMANDS_H

#include <jansson.h>
#include <stdint.h>

/* `berth plugins --config F [--model DIR]` (cmd_plugins.c). */
int cmd_plugins(int argc, char **argv);
/* `berth generate ...` (cmd_generate.c). */
int cmd_generate(int argc, char **argv);
/* `berth generate --prompts-file FILE ...`: many prompts through the serving engine (cmd_generate_batch.c). */
int cmd_generate_batch(int argc, char **argv);
/* The "logprobs" array both generate paths print with --json: per token {"token", "logprob", "top": [{"token",
 * "logprob"}, ...]} (temperature-free, penalised logits). Caller owns the reference. */
struct runner_sample_out;
json_t *generate_logprobs_json(const int32_t *tokens, const struct runner_sample_out *lp, int32_t n);
/* `berth bench --config F --model DIR --concurrency 1,4,16 --prompt-len N --gen-len M` (cmd_bench.c). */
int cmd_bench(int argc, char **argv);
/* `berth tokenize --model DIR [--json] TEXT` (cmd_tokenize.c). */
int cmd_tokenize(int argc, char **argv);
/* `berth chat --config F [--model DIR]`: interactive multi-turn chat (cmd_chat.c). */
int cmd_chat(int argc, char **argv);

#endif

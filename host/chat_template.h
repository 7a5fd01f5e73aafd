/*
 * chat_template.h — render {role, content} chat messages into a model's prompt text.
 *
 * Decision: per-family formatters in C, chosen by recognising the checkpoint's own Jinja chat_template, rather than
 * a Jinja interpreter. Why:
 *  - The real templates need far more than a "small subset": Qwen3's uses namespace() objects with attribute
 *    assignment, reversed slices (messages[::-1]), Python string methods (split/startswith/endswith/strip/lstrip/
 *    rstrip), `is defined` / `is none` / `is string` tests, the tojson filter and loop.* variables; Gemma's uses
 *    raise_exception, slices and the trim filter. A sandboxed interpreter covering that is a large parser of
 *    untrusted input (every checkpoint ships its own template) — a fuzzing and security surface out of proportion
 *    to the handful of families berth runs.
 *  - A formatter is ~40 lines that a reader can check against the template line by line, and it is tested here
 *    against apply_chat_template output (tests/fixtures/chat/).
 *  - Recognition is strict: a template that matches no known family fails with a message instead of being
 *    rendered wrongly; --chat-format NAME overrides it (and serves checkpoints without a template).
 * The formatters live in the host for now because the plugin ABI has no hook for them; the clean home is the model
 * plugin (a `format_chat` entry in berth_model_vtable, proposed in the report), since the family is the plugin's
 * knowledge. Not rendered: tools / tool_calls (Qwen3 "tool" messages are), images.
 */
#ifndef BERTH_HOST_CHAT_TEMPLATE_H
#define BERTH_HOST_CHAT_TEMPLATE_H

#include <berth/plugin.h>
#include <stddef.h>

typedef enum {
    CHAT_FORMAT_GEMMA3 = 1, /* <start_of_turn>user ... <end_of_turn>; system text prefixed to the first user turn */
    CHAT_FORMAT_QWEN3,      /* ChatML <|im_start|> ... <|im_end|> with Qwen3's <think> handling */
} chat_format;

struct chat_message {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content;
};

struct chat_template {
    chat_format format;
    char *bos_token;     /* tokenizer_config.json bos_token ("" when absent) */
};

/* "gemma3" / "qwen3" -> format; BERTH_E_INVALID naming the choices otherwise. */
berth_status chat_format_from_name(const char *name, chat_format *out);
const char *chat_format_name(chat_format f);
/* Which family a Jinja chat template is; BERTH_E_UNSUPPORTED ("unrecognised chat template ...") if none. */
berth_status chat_format_detect(const char *jinja, chat_format *out);

/* Read DIR/tokenizer_config.json: its chat_template (a string, or a list of {name, template}: "default") and
 * bos_token. format_name (may be NULL) overrides recognition. Fills *out; free with chat_template_free. */
berth_status chat_template_load(const char *model_dir, const char *format_name, struct chat_template *out);
/* The same from a parsed tokenizer_config.json (cfg may be NULL with format_name); path is for messages. */
typedef struct json_t json_t;
berth_status chat_template_from_config(const json_t *cfg, const char *path, const char *format_name,
                                       struct chat_template *out);
void chat_template_free(struct chat_template *t);

/* Render messages as transformers' apply_chat_template(messages, add_generation_prompt, enable_thinking) would.
 * enable_thinking: -1 undefined (the template's default), 0 false, 1 true. *out: caller frees. Fails like the
 * template does (e.g. Gemma's "Conversation roles must alternate user/assistant/user/assistant/..."). */
berth_status chat_render(const struct chat_template *t, const struct chat_message *msgs, size_t n,
                         int add_generation_prompt, int enable_thinking, char **out);

#endif

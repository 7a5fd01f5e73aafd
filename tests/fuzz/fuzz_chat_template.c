/*
 * fuzz_chat_template.c — libFuzzer target: a checkpoint's tokenizer_config.json and a conversation, both arbitrary,
 * through the chat formatters (chat_template.h): recognition of the config's chat_template (or a --chat-format
 * override), then chat_render. Each must fail with a one-line message, or succeed (a render returns its text).
 * Input layout: byte 0 picks the override (none / gemma3 / qwen3 / a bogus name), add_generation_prompt and
 * enable_thinking; the rest splits at NUL bytes into the config text, then messages whose first byte picks the
 * role (system, user, assistant, tool, or an unknown one). Build and run: tests/fuzz/build.sh.
 */
#include <jansson.h>

#include "chat_template.h"
#include "fuzz_util.h"

#define MAX_MSGS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const char *const overrides[] = {NULL, "gemma3", "qwen3", "llama"};
    static const char *const roles[] = {"system", "user", "assistant", "tool", "narrator"};
    const char *fmt = overrides[data[0] & 3];
    const int add_gen = (data[0] >> 2) & 1, thinking = (int)((data[0] >> 3) % 3) - 1;

    /* split the rest at NUL bytes into NUL-terminated copies */
    char *buf = malloc(size); /* size - 1 bytes + a final NUL */
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    const char *parts[1 + MAX_MSGS];
    size_t n_parts = 0;
    for (size_t i = 0; n_parts < 1 + MAX_MSGS;) {
        parts[n_parts++] = buf + i;
        const size_t len = strlen(buf + i);
        if (i + len >= size - 1) break;
        i += len + 1;
    }

    json_error_t je;
    json_t *cfg = json_loads(parts[0], 0, &je); /* NULL: not JSON, as a missing file */
    struct chat_template t;
    memset(&t, 0, sizeof t);
    berth_status st = chat_template_from_config(cfg, "tokenizer_config.json", fmt, &t);
    json_decref(cfg);
    if (st != BERTH_OK) {
        fuzz_require_one_line_error();
        free(buf);
        return 0;
    }
    struct chat_message msgs[MAX_MSGS];
    size_t n = 0;
    for (size_t k = 1; k < n_parts; k++, n++) {
        const unsigned char r = (unsigned char)parts[k][0];
        msgs[n].role = roles[r % 5];
        msgs[n].content = parts[k][0] ? parts[k] + 1 : parts[k];
    }
    char *out = NULL;
    st = chat_render(&t, msgs, n, add_gen, thinking, &out);
    if (st != BERTH_OK) {
        fuzz_require_one_line_error();
        fuzz_require(out == NULL, "a failed render that still returned text");
    } else {
        fuzz_require(out != NULL, "a render without text");
        free(out);
    }
    chat_template_free(&t);
    free(buf);
    return 0;
}

/*
 * prompt_text.c — checkpoint tokenizer loading, prompt encoding and streamed detokenization (prompt_text.h).
 */
#include "prompt_text.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"

berth_status prompt_tokenizer_open(const char *model_dir, int required, berth_tokenizer **out)
{
    *out = NULL;
    char tj[4096], tc[4096];
    if ((size_t)snprintf(tj, sizeof tj, "%s/tokenizer.json", model_dir) >= sizeof tj ||
        (size_t)snprintf(tc, sizeof tc, "%s/tokenizer_config.json", model_dir) >= sizeof tc)
        return berth_fail(BERTH_E_INVALID, "%s: model folder path too long", model_dir);
    if (access(tj, F_OK) != 0) {
        if (!required) return BERTH_OK;
        return berth_fail(BERTH_E_NOT_FOUND, "%s: not found; text prompts need the checkpoint's tokenizer", tj);
    }
    return tok_load(tj, access(tc, F_OK) == 0 ? tc : NULL, out);
}

berth_status prompt_encode(berth_tokenizer *t, const char *text, int add_special, int32_t **ids, int32_t *n)
{
    size_t k;
    *ids = NULL;
    *n = 0;
    berth_status st = tok_encode(t, text, strlen(text), add_special, ids, &k);
    if (st) return st;
    if (k == 0 || k > INT32_MAX) {
        free(*ids);
        *ids = NULL;
        return berth_fail(BERTH_E_INVALID, k ? "the prompt encodes to too many tokens" : "the prompt encodes to no tokens");
    }
    *n = (int32_t)k;
    return BERTH_OK;
}

struct prompt_stream {
    const berth_tokenizer *tok;
    berth_tok_stream *ts;
    FILE *echo;
    char *text;
    size_t len, cap;
    berth_status err;   /* first failure of a push, kept for finish */
    char err_msg[512];
};

static berth_status append(struct prompt_stream *s, const char *p, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (s->len + n + 1 > cap) cap *= 2;
        char *q = realloc(s->text, cap);
        if (!q) return berth_fail(BERTH_E_NOMEM, "out of memory collecting the generated text");
        s->text = q, s->cap = cap;
    }
    memcpy(s->text + s->len, p, n);
    s->len += n;
    s->text[s->len] = '\0';
    if (s->echo && n) {
        fwrite(p, 1, n, s->echo);
        fflush(s->echo);
    }
    return BERTH_OK;
}

berth_status prompt_stream_reset(struct prompt_stream *s)
{
    tok_stream_free(s->ts);
    s->ts = NULL;
    s->len = 0;
    if (s->text) s->text[0] = '\0';
    s->err = BERTH_OK;
    return tok_stream_new(s->tok, 1, &s->ts);
}

berth_status prompt_stream_new(const berth_tokenizer *t, FILE *echo, struct prompt_stream **out)
{
    *out = NULL;
    struct prompt_stream *s = calloc(1, sizeof *s);
    if (!s) return berth_fail(BERTH_E_NOMEM, "out of memory");
    s->tok = t;
    s->echo = echo;
    berth_status st = prompt_stream_reset(s);
    if (st) {
        prompt_stream_free(s);
        return st;
    }
    *out = s;
    return BERTH_OK;
}

int prompt_stream_on_token(int32_t token, void *arg)
{
    struct prompt_stream *s = arg;
    if (s->err) return 0;
    char *piece;
    size_t n;
    berth_status st = tok_stream_push_n(s->ts, token, &piece, &n);
    if (!st) {
        st = append(s, piece, n);
        free(piece);
    }
    if (st) {
        s->err = st;
        snprintf(s->err_msg, sizeof s->err_msg, "%s", berth_last_error());
    }
    return 0;
}

berth_status prompt_stream_finish(struct prompt_stream *s, const char **text, size_t *len)
{
    if (s->err) return berth_fail(s->err, "%s", s->err_msg);
    char *piece;
    size_t n;
    berth_status st = tok_stream_finish_n(s->ts, &piece, &n);
    if (st) return st;
    st = append(s, piece, n);
    free(piece);
    if (st) return st;
    if (!s->text && (st = append(s, "", 0))) return st;
    *text = s->text;
    *len = s->len;
    return BERTH_OK;
}

void prompt_stream_free(struct prompt_stream *s)
{
    if (!s) return;
    tok_stream_free(s->ts);
    free(s->text);
    free(s);
}

/*
 * fuzz_tokenizer_encode.c — libFuzzer target: encode/decode on the real tokenizers (Qwen3 BPE, ALBERT Unigram with
 * the Precompiled charsmap, the tiny Gemma 4 BPE). The first input byte picks the tokenizer; the rest is the text.
 * Invalid UTF-8 must be refused with an error; valid text must encode, and the streamed decode of its ids must equal
 * the one-shot decode (abort() otherwise, so libFuzzer records it). The same bytes are also decoded as raw ids.
 * BERTH_SOURCE_ROOT locates the fixtures (default: the current folder). Build: tests/fuzz/build.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static const char *const files[] = {"tests/fixtures/tokenizers/qwen3/tokenizer.json.gz",
                                    "tests/fixtures/tokenizers/albert/tokenizer.json.gz",
                                    "tests/fixtures/tiny-gemma4/tokenizer.json"};
#define N_TOK (sizeof files / sizeof *files)
static berth_tokenizer *toks[N_TOK];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *root = getenv("BERTH_SOURCE_ROOT");
    for (size_t i = 0; i < N_TOK; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", root ? root : ".", files[i]);
        if (tok_load(p, NULL, &toks[i]) != BERTH_OK) {
            fprintf(stderr, "fuzz_tokenizer_encode: cannot load %s (set BERTH_SOURCE_ROOT)\n", p);
            exit(1);
        }
    }
    return 0;
}

static void stream_check(berth_tokenizer *t, const int32_t *ids, size_t n, int skip)
{
    char *full;
    size_t fl;
    if (tok_decode_n(t, ids, n, skip, &full, &fl) != BERTH_OK) return;
    berth_tok_stream *s;
    if (tok_stream_new(t, skip, &s) != BERTH_OK) abort();
    char *acc = malloc(fl + 1);
    size_t al = 0;
    for (size_t i = 0; i <= n; i++) {
        char *p;
        size_t pl;
        if ((i < n ? tok_stream_push_n(s, ids[i], &p, &pl) : tok_stream_finish_n(s, &p, &pl)) != BERTH_OK) abort();
        if (al + pl > fl) abort();
        memcpy(acc + al, p, pl);
        al += pl;
        free(p);
    }
    if (al != fl || memcmp(acc, full, fl)) abort();
    free(acc);
    free(full);
    tok_stream_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    berth_tokenizer *t = toks[data[0] % N_TOK];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    if (tok_encode(t, text, len, data[0] & 0x80, &ids, &n) == BERTH_OK) {
        stream_check(t, ids, n, 0);
        stream_check(t, ids, n, 1);
        free(ids);
    }
    /* the bytes as ids, in and out of the vocabulary */
    size_t m = len / 2;
    int32_t *raw = malloc((m + 1) * sizeof *raw);
    size_t V = tok_vocab_size(t);
    for (size_t i = 0; i < m; i++) {
        uint16_t v = (uint16_t)(data[1 + 2 * i] | data[2 + 2 * i] << 8);
        raw[i] = (int32_t)(v == 0xFFFF ? V : (size_t)v * 151 % V);
    }
    char *out;
    size_t ol;
    if (tok_decode_n(t, raw, m, data[0] & 1, &out, &ol) == BERTH_OK) {
        free(out);
        stream_check(t, raw, m, data[0] & 1);
    }
    free(raw);
    return 0;
}

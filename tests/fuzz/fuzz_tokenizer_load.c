/*
 * fuzz_tokenizer_load.c — libFuzzer target: arbitrary bytes as tokenizer.json. Loading must fail with a message or
 * succeed; a tokenizer that loads must then encode, decode and stream a fixed mixed text without a crash or a
 * sanitizer report. Build and run: tests/fuzz/build.sh (seeds: tests/fuzz/seeds_load/).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "tokenizer.h"

static const char sample[] = "Hello wörld! <s> 12345 \xe2\x82\xac \xf0\x9f\xa4\x96 tab\there\n\nend";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/berth_fuzz_load_%d.json", (int)getpid());
    if (!fuzz_write_file(path, data, size)) return 0;
    berth_tokenizer *t;
    if (tok_load(path, NULL, &t) != BERTH_OK) return 0;
    for (int add = 0; add < 2; add++) {
        int32_t *ids;
        size_t n;
        if (tok_encode(t, sample, sizeof sample - 1, add, &ids, &n) != BERTH_OK) continue;
        char *text;
        size_t len;
        if (tok_decode_n(t, ids, n, add, &text, &len) == BERTH_OK) free(text);
        berth_tok_stream *s;
        if (tok_stream_new(t, add, &s) == BERTH_OK) {
            for (size_t i = 0; i < n; i++) {
                char *p;
                if (tok_stream_push(s, ids[i], &p) == BERTH_OK) free(p);
            }
            char *p;
            if (tok_stream_finish(s, &p) == BERTH_OK) free(p);
            tok_stream_free(s);
        }
        free(ids);
    }
    tok_free(t);
    return 0;
}

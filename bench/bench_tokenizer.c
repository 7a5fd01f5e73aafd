/*
 * bench_tokenizer.c — encode throughput of one tokenizer.json on a deterministic ~1 MiB mixed-language text.
 *
 *   bench_tokenizer --tokenizer FILE [--config FILE] [--inputs JSON]... [--text-out FILE] [--size BYTES]
 *
 * Text: the strings of the --inputs JSON arrays (default: tests/fixtures/tokenizers/corpus_inputs.json and
 * tools/golden_inputs.json under --fixtures DIR), picked in a fixed pseudo-random order (xorshift64, fixed seed)
 * and joined with "\n" until the next string would pass --size bytes (default 1 MiB). Picking at random rather
 * than cycling in order keeps the text from being one ~8 KB block repeated, though both berth and Hugging Face
 * cache words, so repeated words are cheap in both. The strings cover English, code, CJK, Cyrillic, Arabic,
 * Devanagari, emoji/ZWJ sequences, whitespace and control runs, and inline special tokens. --text-out writes the
 * exact bytes so the npm side (bench/tokenizer_npm.js) encodes the same text.
 *
 * Two modes, both without special tokens (add_special = 0; special tokens written in the text are still split
 * off, as in Hugging Face): "whole" encodes the text in one tok_encode call; "lines" encodes each line (its
 * trailing '\n' included) in its own call. Each mode: one untimed warm-up, then the best of 3 timed runs
 * (CLOCK_MONOTONIC). MB/s = 10^6 bytes per second. Output: one "RESULT" line per mode, machine-readable:
 *   RESULT mode=whole bytes=1048000 tokens=312345 best_s=0.1234 mbps=8.49
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "errors.h"
#include "tokenizer.h"

#define TIMED_RUNS 3
#define MAX_INPUTS 8
#define DEFAULT_SIZE (1u << 20)

static const char usage[] =
    "usage: bench_tokenizer --tokenizer FILE [--config FILE] [--fixtures DIR | --inputs JSON...]\n"
    "                       [--text-out FILE] [--size BYTES]\n"
    "  --tokenizer FILE  tokenizer.json or tokenizer.json.gz\n"
    "  --config FILE     tokenizer_config.json (optional)\n"
    "  --fixtures DIR    tests/fixtures/tokenizers (reads corpus_inputs.json and tools/golden_inputs.json)\n"
    "  --inputs JSON     a JSON array of strings to build the text from (repeatable; replaces --fixtures)\n"
    "  --text-out FILE   write the benchmark text here (for bench/tokenizer_npm.js)\n"
    "  --size BYTES      text size bound (default 1048576)\n";

struct strings {
    char **s;
    size_t *len;
    size_t n;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Appends every string of the JSON array in path to out (copies; caller frees via strings_free). */
static int strings_load(const char *path, struct strings *out) {
    json_error_t err;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &err);
    if (!root) {
        fprintf(stderr, "bench_tokenizer: %s:%d: %s\n", path, err.line, err.text);
        return -1;
    }
    if (!json_is_array(root)) {
        fprintf(stderr, "bench_tokenizer: %s: expected a JSON array of strings\n", path);
        json_decref(root);
        return -1;
    }
    size_t add = json_array_size(root);
    char **s = realloc(out->s, (out->n + add) * sizeof *s);
    size_t *len = s ? realloc(out->len, (out->n + add) * sizeof *len) : NULL;
    if (s) out->s = s;
    if (len) out->len = len;
    if (!s || !len) goto oom;
    for (size_t i = 0; i < add; i++) {
        const json_t *v = json_array_get(root, i);
        if (!json_is_string(v)) {
            fprintf(stderr, "bench_tokenizer: %s: element %zu is not a string\n", path, i);
            json_decref(root);
            return -1;
        }
        size_t l = json_string_length(v);
        char *c = malloc(l + 1);
        if (!c) goto oom;
        memcpy(c, json_string_value(v), l + 1);
        out->s[out->n] = c;
        out->len[out->n++] = l;
    }
    json_decref(root);
    return 0;
oom:
    fprintf(stderr, "bench_tokenizer: out of memory reading %s\n", path);
    json_decref(root);
    return -1;
}

static void strings_free(struct strings *st) {
    for (size_t i = 0; i < st->n; i++) free(st->s[i]);
    free(st->s);
    free(st->len);
}

static uint64_t xorshift64(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* The benchmark text: strings in a fixed pseudo-random order joined by '\n', at most size bytes. Caller frees. */
static char *text_build(const struct strings *st, size_t size, size_t *len_out) {
    char *t = malloc(size);
    if (!t) return NULL;
    size_t len = 0, empty_picks = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (;;) {
        const size_t i = (size_t)(xorshift64(&rng) % st->n);
        const size_t need = st->len[i] + (len ? 1 : 0);
        if (len + need > size) break;
        if (st->len[i] == 0 && ++empty_picks > 1000) break; /* only empty strings fit: stop */
        if (len) t[len++] = '\n';
        memcpy(t + len, st->s[i], st->len[i]);
        len += st->len[i];
    }
    *len_out = len;
    return t;
}

/* One pass of mode over text; returns tokens produced or -1 (message printed). */
static long long encode_pass(berth_tokenizer *tok, const char *text, size_t len, int per_line) {
    long long tokens = 0;
    size_t pos = 0;
    while (pos < len) {
        size_t end = len;
        if (per_line) {
            const char *nl = memchr(text + pos, '\n', len - pos);
            if (nl) end = (size_t)(nl - text) + 1;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        berth_status st = tok_encode(tok, text + pos, end - pos, 0, &ids, &n);
        if (st != BERTH_OK) {
            fprintf(stderr, "bench_tokenizer: encode at byte %zu: %s\n", pos, berth_last_error());
            return -1;
        }
        free(ids);
        tokens += (long long)n;
        pos = end;
    }
    return tokens;
}

static int bench_mode(berth_tokenizer *tok, const char *text, size_t len, int per_line) {
    const long long warm = encode_pass(tok, text, len, per_line);
    if (warm < 0) return -1;
    double best = 1e300;
    for (int r = 0; r < TIMED_RUNS; r++) {
        const double t0 = now_s();
        const long long n = encode_pass(tok, text, len, per_line);
        const double dt = now_s() - t0;
        if (n != warm) {
            fprintf(stderr, "bench_tokenizer: run %d gave %lld tokens, warm-up gave %lld\n", r, n, warm);
            return -1;
        }
        if (dt < best) best = dt;
    }
    printf("RESULT mode=%s bytes=%zu tokens=%lld best_s=%.4f mbps=%.2f\n", per_line ? "lines" : "whole", len, warm,
           best, (double)len / best / 1e6);
    return 0;
}

int main(int argc, char **argv) {
    const char *tok_path = NULL, *cfg_path = NULL, *fixtures = NULL, *text_out = NULL;
    const char *inputs[MAX_INPUTS];
    size_t n_inputs = 0, size = DEFAULT_SIZE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_tokenizer: %s needs a value\n%s", a, usage);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--tokenizer")) tok_path = v;
        else if (!strcmp(a, "--config")) cfg_path = v;
        else if (!strcmp(a, "--fixtures")) fixtures = v;
        else if (!strcmp(a, "--text-out")) text_out = v;
        else if (!strcmp(a, "--inputs") && n_inputs < MAX_INPUTS) inputs[n_inputs++] = v;
        else if (!strcmp(a, "--size")) {
            char *end;
            unsigned long long s = strtoull(v, &end, 10);
            if (*end || s == 0 || s > (1ull << 30)) {
                fprintf(stderr, "bench_tokenizer: --size: expected 1..%llu bytes, got '%s'\n", 1ull << 30, v);
                return 2;
            }
            size = (size_t)s;
        } else {
            fprintf(stderr, "bench_tokenizer: unknown or repeated-too-often option '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (!tok_path || (!fixtures && !n_inputs)) {
        fputs(usage, stderr);
        return 2;
    }
    char corpus[4096], golden[4096];
    if (!n_inputs) {
        snprintf(corpus, sizeof corpus, "%s/corpus_inputs.json", fixtures);
        snprintf(golden, sizeof golden, "%s/tools/golden_inputs.json", fixtures);
        inputs[n_inputs++] = corpus;
        inputs[n_inputs++] = golden;
    }

    int rc = 1;
    struct strings st = {0};
    char *text = NULL;
    berth_tokenizer *tok = NULL;
    for (size_t i = 0; i < n_inputs; i++)
        if (strings_load(inputs[i], &st)) goto out;
    if (!st.n) {
        fprintf(stderr, "bench_tokenizer: the inputs hold no strings\n");
        goto out;
    }
    size_t len = 0;
    text = text_build(&st, size, &len);
    if (!text) {
        fprintf(stderr, "bench_tokenizer: out of memory building %zu bytes of text\n", size);
        goto out;
    }
    if (text_out) {
        FILE *f = fopen(text_out, "wb");
        if (!f || fwrite(text, 1, len, f) != len || fclose(f)) {
            fprintf(stderr, "bench_tokenizer: cannot write %s\n", text_out);
            goto out;
        }
    }
    const double t0 = now_s();
    if (tok_load(tok_path, cfg_path, &tok) != BERTH_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", berth_last_error());
        goto out;
    }
    printf("tokenizer %s: loaded in %.3f s; text %zu bytes from %zu strings\n", tok_path, now_s() - t0, len, st.n);
    if (bench_mode(tok, text, len, 0) || bench_mode(tok, text, len, 1)) goto out;
    rc = 0;
out:
    tok_free(tok);
    free(text);
    strings_free(&st);
    return rc;
}

/*
 * cmd_tokenize.c — `berth tokenize --model DIR [--json] [--no-special] TEXT`: the ids and pieces the checkpoint's
 * tokenizer.json gives TEXT ("-" reads standard input), with the post-processor's special tokens (BOS) unless
 * --no-special — the same ids `berth generate --prompt TEXT` feeds the model.
 * Plain output: one token a line, "ID<TAB>PIECE", the piece as stored in the vocabulary with control characters and
 * backslashes escaped (\n, \t, \\, \xNN) so every token stays on its line. --json: {"ids": [...], "pieces": [...]}.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "errors.h"
#include "host_services.h"
#include "prompt_text.h"

static const char tokenize_usage[] =
    "usage: berth tokenize --model DIR [--json] [--no-special] TEXT\n"
    "  --model DIR     Hugging Face checkpoint folder holding tokenizer.json\n"
    "  --json          print {\"ids\": [...], \"pieces\": [...]}\n"
    "  --no-special    leave out the special tokens the post-processor adds (BOS)\n"
    "  TEXT            the text; \"-\" reads standard input\n";

static int usage_error(const char *fmt, const char *arg)
{
    fputs("berth tokenize: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", tokenize_usage);
    return 2;
}

/* All of stdin, NUL-terminated; NULL on OOM or read error. Caller frees. */
static char *read_stdin(void)
{
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    while (b) {
        len += fread(b + len, 1, cap - len - 1, stdin);
        if (ferror(stdin)) break;
        if (feof(stdin)) {
            b[len] = '\0';
            return b;
        }
        if (len + 1 == cap) {
            char *q = realloc(b, cap * 2);
            if (!q) break;
            b = q, cap *= 2;
        }
    }
    free(b);
    return NULL;
}

static void print_escaped(const char *p)
{
    for (; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02X", c);
        else putchar(c);
    }
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *text_arg = NULL;
    int json = 0, special = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--model") == 0) {
            if (i + 1 >= argc) return usage_error("%s needs a value", a);
            dir = argv[++i];
        } else if (strncmp(a, "--model=", 8) == 0) {
            dir = a + 8;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--no-special") == 0) {
            special = 0;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(tokenize_usage, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0' && strcmp(a, "--") != 0) {
            return usage_error("unknown argument '%s'", a);
        } else {
            if (strcmp(a, "--") == 0) {
                if (++i >= argc) break;
                a = argv[i];
            }
            if (text_arg) return usage_error("more than one TEXT given ('%s')", a);
            text_arg = a;
        }
    }
    if (!dir) return usage_error("%s", "--model DIR is required");
    if (!text_arg) return usage_error("%s", "TEXT is required");
    char *owned = NULL;
    if (strcmp(text_arg, "-") == 0 && !(text_arg = owned = read_stdin())) {
        host_log(BERTH_LOG_ERROR, "cannot read the text from standard input");
        return 1;
    }
    berth_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (prompt_tokenizer_open(dir, 1, &t) || tok_encode(t, text_arg, strlen(text_arg), special, &ids, &n)) {
        host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
        tok_free(t);
        free(owned);
        return 1;
    }
    int rc = 0;
    if (json) {
        json_t *o = json_object(), *ja = json_array(), *pa = json_array();
        for (size_t i = 0; i < n; i++) {
            json_array_append_new(ja, json_integer(ids[i]));
            json_array_append_new(pa, json_string(tok_id_to_piece(t, ids[i])));
        }
        json_object_set_new(o, "ids", ja);
        json_object_set_new(o, "pieces", pa);
        char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(o);
        if (!s) rc = 1;
        else puts(s);
        free(s);
    } else {
        for (size_t i = 0; i < n; i++) {
            printf("%d\t", (int)ids[i]);
            print_escaped(tok_id_to_piece(t, ids[i]));
            putchar('\n');
        }
    }
    if (fflush(stdout) != 0) rc = 1;
    if (rc) host_log(BERTH_LOG_ERROR, "cannot write the result to stdout");
    free(ids);
    tok_free(t);
    free(owned);
    return rc;
}

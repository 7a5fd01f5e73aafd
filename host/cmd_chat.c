/*
 * cmd_chat.c — `berth chat`: an interactive multi-turn conversation on one model, streaming each reply to the
 * terminal as it is generated.
 *
 * Each line read from standard input is a user turn. The whole conversation is rendered with the checkpoint's chat
 * format (chat_template.h), encoded without the post-processor (the template carries BOS, as
 * apply_chat_template(tokenize=True) does), and generated from; the runner reuses the cached prefix of the earlier
 * turns. The reply's text (special tokens left out) becomes the assistant turn. Replies end with a newline; the
 * "> " prompt is shown only on a terminal, so piping lines in gives just the replies. End with EOF or "/exit".
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "checkpoint.h"
#include "commands.h"
#include "config.h"
#include "errors.h"
#include "host_services.h"
#include "prompt_text.h"
#include "registry.h"
#include "runner.h"

static const char chat_usage[] =
    "usage: berth chat --config FILE [--model DIR] [OPTIONS]\n"
    "  --config FILE          the berth INI config\n"
    "  --model DIR            Hugging Face checkpoint folder (default: [model] path of the config)\n"
    "  --system TEXT          a system message first\n"
    "  --chat-format NAME     gemma3 | qwen3 (default: recognised from tokenizer_config.json chat_template)\n"
    "  --no-think             Qwen3: enable_thinking=false\n"
    "  --max-new-tokens N     reply length at most (default 256)\n"
    "  --temperature T / --top-k K / --top-p P / --seed S   sampling, as for berth generate (default greedy)\n";

static int usage_error(const char *fmt, const char *arg)
{
    fputs("berth chat: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", chat_usage);
    return 2;
}

static int num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

struct chat_state {
    struct berth_config *cfg;
    struct registry *reg;
    berth_checkpoint *ck;
    struct selection sel;
    int have_sel;
    struct runner *runner;
    berth_tokenizer *tok;
    struct prompt_stream *stream;
    struct chat_template tmpl;
    struct chat_message *msgs;   /* contents owned (strdup) */
    size_t n_msgs, cap_msgs;
};

static void chat_release(struct chat_state *s)
{
    runner_free(s->runner);
    if (s->have_sel) selection_destroy_model(&s->sel); /* the model goes before the checkpoint */
    ckpt_close(s->ck);
    if (s->have_sel) selection_release(&s->sel);
    registry_free(s->reg);
    config_free(s->cfg);
    prompt_stream_free(s->stream);
    tok_free(s->tok);
    chat_template_free(&s->tmpl);
    for (size_t i = 0; i < s->n_msgs; i++) free((char *)s->msgs[i].content);
    free(s->msgs);
}

static berth_status push_msg(struct chat_state *s, const char *role, const char *content, size_t len)
{
    if (s->n_msgs == s->cap_msgs) {
        size_t cap = s->cap_msgs ? 2 * s->cap_msgs : 16;
        struct chat_message *m = realloc(s->msgs, cap * sizeof *m);
        if (!m) return berth_fail(BERTH_E_NOMEM, "out of memory");
        s->msgs = m, s->cap_msgs = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return berth_fail(BERTH_E_NOMEM, "out of memory");
    memcpy(c, content, len);
    c[len] = '\0';
    s->msgs[s->n_msgs++] = (struct chat_message){role, c};
    return BERTH_OK;
}

/* One turn: render, encode, generate (streaming to stdout), keep the reply. */
static berth_status turn(struct chat_state *s, const struct runner_gen_params *gp, int thinking)
{
    char *prompt;
    berth_status st = chat_render(&s->tmpl, s->msgs, s->n_msgs, 1, thinking, &prompt);
    if (st) return st;
    int32_t *ids = NULL, n = 0;
    st = prompt_encode(s->tok, prompt, 0, &ids, &n);
    free(prompt);
    if (!st) st = runner_check_prompt(runner_info(s->runner), "the model", ids, n, gp->max_new);
    struct runner_generation g = {0};
    if (!st) st = prompt_stream_reset(s->stream);
    if (!st) st = runner_generate(s->runner, ids, n, gp, NULL, prompt_stream_on_token, s->stream, &g);
    free(ids);
    free(g.tokens);
    const char *text;
    size_t len;
    if (!st) st = prompt_stream_finish(s->stream, &text, &len);
    if (!st) {
        fputc('\n', stdout);
        fflush(stdout);
        st = push_msg(s, "assistant", text, len);
    }
    return st;
}

int cmd_chat(int argc, char **argv)
{
    const char *config_path = NULL, *dir = NULL, *system_text = NULL, *format = NULL;
    struct runner_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_new = 256;
    gp.sampling.top_p = 1.0f;
    int thinking = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(chat_usage, stdout);
            return 0;
        } else if (!strcmp(a, "--no-think")) {
            thinking = 0;
        } else if (!strcmp(a, "-v")) {
            host_log_set_level(BERTH_LOG_INFO);
        } else if (!strcmp(a, "-vv")) {
            host_log_set_level(BERTH_LOG_DEBUG);
        } else if (!v) {
            return usage_error(a[0] == '-' ? "%s needs a value" : "unknown argument '%s'", a);
        } else if (!strcmp(a, "--config")) {
            config_path = argv[++i];
        } else if (!strcmp(a, "--model")) {
            dir = argv[++i];
        } else if (!strcmp(a, "--system")) {
            system_text = argv[++i];
        } else if (!strcmp(a, "--chat-format")) {
            format = argv[++i];
        } else if (!strcmp(a, "--max-new-tokens")) {
            if (num(argv[++i], 1, INT32_MAX, &d) || d != (int32_t)d) return usage_error("--max-new-tokens '%s' is not a count >= 1", v);
            gp.max_new = (int32_t)d;
        } else if (!strcmp(a, "--temperature")) {
            if (num(argv[++i], 0, 1e30, &d)) return usage_error("--temperature '%s' is not a number >= 0", v);
            gp.sampling.temperature = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            if (num(argv[++i], 0, INT32_MAX, &d) || d != (int32_t)d) return usage_error("--top-k '%s' is not a count >= 0", v);
            gp.sampling.top_k = (int32_t)d;
        } else if (!strcmp(a, "--top-p")) {
            if (num(argv[++i], 1e-30, 1, &d)) return usage_error("--top-p '%s' is not a number in (0, 1]", v);
            gp.sampling.top_p = (float)d;
        } else if (!strcmp(a, "--seed")) {
            if (num(argv[++i], 0, 1.8e19, &d) || d != (double)(uint64_t)d) return usage_error("--seed '%s' is not an unsigned integer", v);
            gp.sampling.seed = (uint64_t)d;
        } else {
            return usage_error("unknown argument '%s'", a);
        }
    }
    if (!config_path) return usage_error("%s", "--config FILE is required");

    struct chat_state s;
    memset(&s, 0, sizeof s);
    berth_status st = config_load(config_path, &s.cfg);
    if (!st && !dir && !(dir = s.cfg->model_path)) {
        chat_release(&s);
        return usage_error("%s", "--model DIR is required (the config has no [model] path)");
    }
    if (!st) st = chat_template_load(dir, format, &s.tmpl);
    if (!st) st = prompt_tokenizer_open(dir, 1, &s.tok);
    if (!st) st = prompt_stream_new(s.tok, stdout, &s.stream);
    if (!st) st = registry_load(s.cfg, &s.reg);
    if (!st) st = ckpt_open(dir, &s.ck);
    if (!st && !(st = registry_select(s.reg, s.ck, &s.sel))) s.have_sel = 1;
    if (!st) {
        struct runner_config rc;
        memset(&rc, 0, sizeof rc);
        rc.be = &s.sel.api;
        rc.mvt = s.sel.model_plugin->desc->vtable;
        rc.model = s.sel.model;
        rc.ck = s.ck;
        rc.model_dir = dir;
        rc.max_batch_tokens = s.cfg->sched_max_batch_tokens;
        rc.max_seqs = 1;
        rc.kv_block_size = s.cfg->kv_block_size;
        rc.kv_memory = s.cfg->kv_memory_bytes;
        rc.kv_dtype = s.cfg->kv_dtype;
        rc.no_graphs = !s.cfg->sched_graphs;
        rc.overlap = s.cfg->sched_overlap;
        st = runner_create(&rc, &s.runner);
    }
    if (!st && system_text) st = push_msg(&s, "system", system_text, strlen(system_text));
    host_log(BERTH_LOG_INFO, "chat format %s", chat_format_name(s.tmpl.format));
    int tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    char *line = NULL;
    size_t lcap = 0;
    while (!st) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        ssize_t k = getline(&line, &lcap, stdin);
        if (k < 0) break;
        while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r')) line[--k] = '\0';
        if (!strcmp(line, "/exit")) break;
        if (k == 0) continue;
        st = push_msg(&s, "user", line, (size_t)k);
        if (!st) st = turn(&s, &gp, thinking);
    }
    free(line);
    if (st) host_log(BERTH_LOG_ERROR, "%s", berth_last_error());
    chat_release(&s);
    return st ? 1 : 0;
}

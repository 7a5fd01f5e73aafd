/*
 * cmd_generate.c — `berth generate`: run a prompt (token ids, or text through the checkpoint's tokenizer.json,
 * prompt_text.h) through a model and print the continuation.
 *
 * Flow: config -> plugins -> checkpoint -> model plugin + backend -> weights fit? -> prompt valid? -> load
 * (runner) -> generate -> print. Every failure is one line on stderr ("berth: error: ...") and exit 1; bad usage
 * exits 2. Output without --json: the generated ids, space separated, one line (with --prompt: the generated
 * text, streamed as it comes); with --json one object, with "text" when the checkpoint has a tokenizer.json.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "commands.h"
#include "config.h"
#include "errors.h"
#include "host_services.h"
#include "registry.h"
#include "prompt_text.h"
#include "runner.h"

/* Progress is shown while paging in checkpoints above this size, and only on a terminal. */
#define PROGRESS_MIN_BYTES (64ull << 20)
#define DEFAULT_MAX_NEW_TOKENS 32

static const char generate_usage[] =
    "usage: berth generate --config FILE [--model DIR] (--prompt TEXT | --prompt-ids ID,ID,...) [OPTIONS]\n"
    "  --config FILE          the berth INI config\n"
    "  --model DIR            Hugging Face checkpoint folder (default: [model] path of the config)\n"
    "  --prompt TEXT          prompt text, encoded with DIR/tokenizer.json (BOS added as the tokenizer does)\n"
    "  --prompt-ids LIST      prompt token ids, comma separated (e.g. 2,17,99)\n"
    "  --prompts-file FILE    many prompts (one a line) run concurrently; see berth generate --prompts-file --help\n"
    "  --max-new-tokens N     tokens to generate at most (default 32)\n"
    "  --temperature T        0 = greedy (default); > 0 samples\n"
    "  --top-k K              keep the K most likely tokens (0 = off, default)\n"
    "  --top-p P              nucleus sampling mass in (0, 1] (1 = off, default)\n"
    "  --min-p P              keep tokens with probability >= P x the best one's, P in [0, 1] (0 = off, default)\n"
    "  --repetition-penalty R > 1 discourages tokens already in the prompt or output (1 = off, default)\n"
    "  --presence-penalty X   subtracted once from the logit of every token already generated (0 = off)\n"
    "  --frequency-penalty X  subtracted per occurrence of each token already generated (0 = off)\n"
    "                         (prompt tokens count for --repetition-penalty only, as in vLLM / OpenAI)\n"
    "  --logprobs N           with --json: each token's logprob and the N (0..20) most likely tokens' logprobs\n"
    "  --seed S               seed of the sampler (default 0)\n"
    "  --ignore-eos           do not stop at the model's end-of-sequence ids\n"
    "  --json                 print one JSON object: tokens, text, prompt_tokens, finish_reason, stats\n"
    "  --dump-logits FILE     write the prompt's logits, raw little-endian float32 [prompt_len, vocab]\n"
    "  -v, -vv                log more on stderr\n";

struct gen_args {
    const char *config_path;
    const char *model_dir;
    const char *prompt_text;
    const char *prompt_str;   /* --prompt */
    const char *dump_path;
    int32_t *prompt;
    int32_t n_prompt;
    struct runner_gen_params gen;
    int json;
};

static int usage_error(const char *fmt, const char *arg)
{
    fputs("berth generate: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", generate_usage);
    return 2;
}

/* "--name value" or "--name=value": the value (advancing *i), or NULL when argv[*i] is another option. */
static const char *option_value(int argc, char **argv, int *i, const char *name, int *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static int parse_i64(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_f32(const char *s, double lo, double hi, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = (float)v;
    return 0;
}

/* "2,17,99" -> ids. Each item an integer in int32 range (vocabulary checks come later, with the model). */
static int parse_ids(const char *text, int32_t **out, int32_t *n)
{
    size_t cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return -1;
    int32_t count = 0;
    const char *p = text;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        long long v;
        while (len && (*p == ' ')) p++, len--;
        while (len && p[len - 1] == ' ') len--;
        if (len == 0 || len >= sizeof item) goto bad;
        memcpy(item, p, len);
        item[len] = '\0';
        if (parse_i64(item, INT32_MIN, INT32_MAX, &v)) goto bad;
        ids[count++] = (int32_t)v;
        if (!comma) break;
        p = comma + 1;
    }
    *out = ids;
    *n = count;
    return 0;
bad:
    free(ids);
    return -1;
}

/* 0 ok, 1 --help printed, 2 usage error printed. */
static int parse_args(int argc, char **argv, struct gen_args *a)
{
    memset(a, 0, sizeof *a);
    a->gen.max_new = DEFAULT_MAX_NEW_TOKENS;
    a->gen.sampling.temperature = 0.0f;
    a->gen.sampling.top_k = 0;
    a->gen.sampling.top_p = 1.0f;
    a->gen.sampling.seed = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        long long n;
        if ((v = option_value(argc, argv, &i, "--config", &missing))) {
            a->config_path = v;
        } else if ((v = option_value(argc, argv, &i, "--model", &missing))) {
            a->model_dir = v;
        } else if ((v = option_value(argc, argv, &i, "--prompt-ids", &missing))) {
            a->prompt_text = v;
        } else if ((v = option_value(argc, argv, &i, "--prompt", &missing))) {
            a->prompt_str = v;
        } else if ((v = option_value(argc, argv, &i, "--max-new-tokens", &missing))) {
            if (parse_i64(v, 0, INT32_MAX, &n)) return usage_error("--max-new-tokens '%s' is not a count >= 0", v);
            a->gen.max_new = (int32_t)n;
        } else if ((v = option_value(argc, argv, &i, "--temperature", &missing))) {
            if (parse_f32(v, 0.0, 1e30, &a->gen.sampling.temperature))
                return usage_error("--temperature '%s' is not a number >= 0", v);
        } else if ((v = option_value(argc, argv, &i, "--top-k", &missing))) {
            if (parse_i64(v, 0, INT32_MAX, &n)) return usage_error("--top-k '%s' is not a count >= 0", v);
            a->gen.sampling.top_k = (int32_t)n;
        } else if ((v = option_value(argc, argv, &i, "--top-p", &missing))) {
            if (parse_f32(v, 0.0, 1.0, &a->gen.sampling.top_p) || a->gen.sampling.top_p <= 0.0f)
                return usage_error("--top-p '%s' is not a number in (0, 1]", v);
        } else if ((v = option_value(argc, argv, &i, "--min-p", &missing))) {
            if (parse_f32(v, 0.0, 1.0, &a->gen.sampling.min_p))
                return usage_error("--min-p '%s' is not a number in [0, 1]", v);
        } else if ((v = option_value(argc, argv, &i, "--repetition-penalty", &missing))) {
            if (parse_f32(v, 0.0, 1e30, &a->gen.sampling.repetition_penalty) ||
                a->gen.sampling.repetition_penalty <= 0.0f)
                return usage_error("--repetition-penalty '%s' is not a number > 0", v);
        } else if ((v = option_value(argc, argv, &i, "--presence-penalty", &missing))) {
            if (parse_f32(v, -1e30, 1e30, &a->gen.sampling.presence_penalty))
                return usage_error("--presence-penalty '%s' is not a number", v);
        } else if ((v = option_value(argc, argv, &i, "--frequency-penalty", &missing))) {
            if (parse_f32(v, -1e30, 1e30, &a->gen.sampling.frequency_penalty))
                return usage_error("--frequency-penalty '%s' is not a number", v);
        } else if ((v = option_value(argc, argv, &i, "--logprobs", &missing))) {
            if (parse_i64(v, 0, RUNNER_MAX_TOP_LOGPROBS, &n))
                return usage_error("--logprobs '%s' is not a count in 0..20", v);
            a->gen.logprobs = 1;
            a->gen.sampling.n_top = (int32_t)n;
        } else if ((v = option_value(argc, argv, &i, "--seed", &missing))) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return usage_error("--seed '%s' is not an unsigned integer", v);
            a->gen.sampling.seed = (uint64_t)s;
        } else if ((v = option_value(argc, argv, &i, "--dump-logits", &missing))) {
            a->dump_path = v;
        } else if (missing) {
            return usage_error("%s needs a value", argv[i]);
        } else if (strcmp(argv[i], "--json") == 0) {
            a->json = 1;
        } else if (strcmp(argv[i], "--ignore-eos") == 0) {
            a->gen.ignore_eos = 1;
        } else if (strcmp(argv[i], "-v") == 0) {
            host_log_set_level(BERTH_LOG_INFO);
        } else if (strcmp(argv[i], "-vv") == 0) {
            host_log_set_level(BERTH_LOG_DEBUG);
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(generate_usage, stdout);
            return 1;
        } else {
            return usage_error("unknown argument '%s'", argv[i]);
        }
    }
    if (!a->config_path) return usage_error("%s", "--config FILE is required");
    if (a->prompt_text && a->prompt_str) return usage_error("%s", "--prompt and --prompt-ids exclude each other");
    if (!a->prompt_text && !a->prompt_str) return usage_error("%s", "--prompt-ids LIST is required");
    if (a->prompt_text && parse_ids(a->prompt_text, &a->prompt, &a->n_prompt))
        return usage_error("--prompt-ids '%s' is not a comma-separated list of integers", a->prompt_text);
    return 0;
}

struct progress {
    const char *dir;
    double total_gb;
    int last_pct;
};

static void show_progress(double frac, void *arg)
{
    struct progress *p = arg;
    int pct = (int)(frac * 100.0 + 0.5);
    if (pct == p->last_pct) return;
    p->last_pct = pct;
    fprintf(stderr, "\rberth: loading %s: %3d%% of %.2f GB", p->dir, pct, p->total_gb);
    fflush(stderr);
}

/* Page the checkpoint in, with a progress line on a terminal for large ones. */
static void prefetch(const berth_checkpoint *ck, const char *dir)
{
    uint64_t total = ckpt_total_bytes(ck);
    if (!isatty(STDERR_FILENO) || total <= PROGRESS_MIN_BYTES) return;
    struct progress p = {dir, (double)total / 1e9, -1};
    ckpt_prefetch(ck, show_progress, &p);
    fputs("\n", stderr);
}

static json_t *stats_json(struct runner *r, const struct selection *sel)
{
    const struct runner_stats *s = runner_stats(r);
    json_t *o = json_object();
    json_object_set_new(o, "prefill_tokens", json_integer(s->prefill_tokens));
    json_object_set_new(o, "decode_steps", json_integer(s->decode_steps));
    json_object_set_new(o, "forward_calls", json_integer(s->forward_calls));
    json_object_set_new(o, "prefill_seconds", json_real(s->prefill_seconds));
    json_object_set_new(o, "decode_seconds", json_real(s->decode_seconds));
    json_object_set_new(o, "decode_tokens_per_second",
                        json_real(s->decode_seconds > 0 ? (double)s->decode_steps / s->decode_seconds : 0.0));
    struct kv_cache *kv = runner_kv(r);
    json_t *peak = json_object(), *total = json_object();
    for (int32_t g = 0; g < kv_n_groups(kv); g++) {
        json_object_set_new(peak, kv_group_name(kv, g), json_integer(g < 8 ? s->kv_peak_blocks[g] : -1));
        json_object_set_new(total, kv_group_name(kv, g), json_integer(kv_blocks_total(kv, g)));
    }
    json_object_set_new(o, "kv_block_size", json_integer(kv_block_size(kv)));
    json_object_set_new(o, "kv_blocks_peak", peak);
    json_object_set_new(o, "kv_blocks_total", total);
    json_object_set_new(o, "backend", json_string(sel->backend_plugin->desc->name));
    json_object_set_new(o, "device", json_string(sel->api.device ? sel->api.device->name : ""));
    json_object_set_new(o, "model_plugin", json_string(sel->model_plugin->desc->name));
    berth_counter ctr[64];
    int32_t n = 0;
    if (runner_model_counters(r, ctr, 64, &n) == BERTH_OK && n > 0) {
        json_t *m = json_object();
        for (int32_t i = 0; i < n && i < 64; i++)
            if (ctr[i].name) json_object_set_new(m, ctr[i].name, json_integer(ctr[i].value));
        json_object_set_new(o, "model", m);
    }
    return o;
}

/* gen_text: the generated text (NULL without a tokenizer); without --json it was already streamed for --prompt. */
static int print_result(const struct gen_args *a, const struct runner_generation *g, struct runner *r,
                        const struct selection *sel, const char *gen_text, size_t gen_len)
{
    if (!a->json && a->prompt_str) {
        putchar('\n');
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (!a->json) {
        for (int32_t i = 0; i < g->n_tokens; i++) printf(i ? " %d" : "%d", (int)g->tokens[i]);
        putchar('\n');
        return fflush(stdout) == 0 ? 0 : 1;
    }
    json_t *o = json_object();
    json_t *toks = json_array();
    for (int32_t i = 0; i < g->n_tokens; i++) json_array_append_new(toks, json_integer(g->tokens[i]));
    json_object_set_new(o, "prompt_tokens", json_integer(a->n_prompt));
    json_object_set_new(o, "tokens", toks);
    if (gen_text) json_object_set_new(o, "text", json_stringn(gen_text, gen_len));
    if (g->logprobs)
        json_object_set_new(o, "logprobs", generate_logprobs_json(g->tokens, g->logprobs, g->n_tokens));
    json_object_set_new(o, "finish_reason", json_string(g->finish_reason));
    json_object_set_new(o, "stats", stats_json(r, sel));
    char *text = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    if (!text) return 1;
    puts(text);
    free(text);
    return fflush(stdout) == 0 ? 0 : 1;
}

/* Everything generate holds, released in the order the ABI needs: runner (KV/metadata buffers), model (its
 * scratch), checkpoint (weight buffers, on the backend), backend (selection), plugins, config. */
struct gen_state {
    struct berth_config *cfg;
    struct registry *reg;
    berth_checkpoint *ck;
    struct selection sel;
    int have_sel;
    struct runner *runner;
    FILE *dump;
    float *logits;
    struct runner_generation gen;
    berth_tokenizer *tok;          /* DIR/tokenizer.json, when present */
    struct prompt_stream *text;
};

static void gen_release(struct gen_state *s)
{
    runner_free(s->runner);
    /* The model goes before the checkpoint it was loaded from; selection_release would destroy it only together
     * with the backend, which must outlive ckpt_close. */
    if (s->have_sel && s->sel.model) {
        const berth_model_vtable *mvt = s->sel.model_plugin->desc->vtable;
        mvt->destroy(s->sel.model);
        s->sel.model = NULL;
    }
    ckpt_close(s->ck);
    if (s->have_sel) selection_release(&s->sel);
    registry_free(s->reg);
    config_free(s->cfg);
    if (s->dump) fclose(s->dump);
    free(s->logits);
    free(s->gen.tokens);
    free(s->gen.logprobs);
    prompt_stream_free(s->text);
    tok_free(s->tok);
}

static int fail(struct gen_state *s)
{
    host_log(BERTH_LOG_ERROR, "%s", berth_last_error()[0] ? berth_last_error() : "failed");
    gen_release(s);
    return 1;
}

json_t *generate_logprobs_json(const int32_t *tokens, const struct runner_sample_out *lp, int32_t n)
{
    json_t *lps = json_array();
    for (int32_t i = 0; i < n; i++) {
        json_t *e = json_object(), *top = json_array();
        json_object_set_new(e, "token", json_integer(tokens[i]));
        json_object_set_new(e, "logprob", json_real(lp[i].logprob));
        for (int32_t k = 0; k < lp[i].n_top; k++) {
            json_t *t = json_object();
            json_object_set_new(t, "token", json_integer(lp[i].top_ids[k]));
            json_object_set_new(t, "logprob", json_real(lp[i].top_logprobs[k]));
            json_array_append_new(top, t);
        }
        json_object_set_new(e, "top", top);
        json_array_append_new(lps, e);
    }
    return lps;
}

int cmd_generate(int argc, char **argv)
{
    /* --prompts-file: many prompts at once through the serving engine (cmd_generate_batch.c). */
    for (int i = 1; i < argc; i++)
        if (strncmp(argv[i], "--prompts-file", 14) == 0 && (argv[i][14] == '\0' || argv[i][14] == '='))
            return cmd_generate_batch(argc, argv);
    struct gen_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) {
        free(a.prompt);
        return rc == 1 ? 0 : 2;
    }
    struct gen_state s;
    memset(&s, 0, sizeof s);
    int exit_code = 1;

    if (config_load(a.config_path, &s.cfg) != BERTH_OK) goto out_fail;
    const char *dir = a.model_dir ? a.model_dir : s.cfg->model_path;
    if (!dir) {
        gen_release(&s);
        free(a.prompt);
        return usage_error("%s", "--model DIR is required (the config has no [model] path)");
    }
    if (registry_load(s.cfg, &s.reg) != BERTH_OK) goto out_fail;
    if (ckpt_open(dir, &s.ck) != BERTH_OK) goto out_fail;
    if (registry_select(s.reg, s.ck, &s.sel) != BERTH_OK) goto out_fail;
    s.have_sel = 1;
    host_log(BERTH_LOG_INFO, "running %s with model plugin '%s' on backend '%s' (%s)", dir,
             s.sel.model_plugin->desc->name, s.sel.backend_plugin->desc->name,
             s.sel.api.device ? s.sel.api.device->name : "?");

    const berth_device_info *dev = s.sel.api.device;
    if (dev && dev->total_memory > 0) {
        char what[256];
        snprintf(what, sizeof what, "backend '%s' (%s)", s.sel.backend_plugin->desc->name, dev->name);
        if (ckpt_check_fits(s.ck, dev->total_memory, what) != BERTH_OK) goto out_fail;
    }

    const berth_model_vtable *mvt = s.sel.model_plugin->desc->vtable;
    berth_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (mvt->info(s.sel.model, &info) != BERTH_OK) goto out_fail;
    /* the tokenizer is needed for --prompt and optional otherwise (--json "text") */
    if (prompt_tokenizer_open(dir, a.prompt_str != NULL, &s.tok) != BERTH_OK) goto out_fail;
    if (a.prompt_str && prompt_encode(s.tok, a.prompt_str, 1, &a.prompt, &a.n_prompt) != BERTH_OK) goto out_fail;
    if (s.tok && prompt_stream_new(s.tok, (a.prompt_str && !a.json) ? stdout : NULL, &s.text) != BERTH_OK)
        goto out_fail;
    if (runner_check_prompt(&info, dir, a.prompt, a.n_prompt, a.gen.max_new) != BERTH_OK) goto out_fail;

    if (a.dump_path) {
        s.dump = fopen(a.dump_path, "wb");
        if (!s.dump) {
            berth_fail(BERTH_E_IO, "--dump-logits %s: %s", a.dump_path, strerror(errno));
            goto out_fail;
        }
        s.logits = malloc((size_t)a.n_prompt * (size_t)info.vocab_size * sizeof *s.logits);
        if (!s.logits) {
            berth_fail(BERTH_E_NOMEM, "--dump-logits: no memory for %d x %d logits", (int)a.n_prompt,
                       (int)info.vocab_size);
            goto out_fail;
        }
    }

    prefetch(s.ck, dir);
    struct runner_config rc_cfg;
    memset(&rc_cfg, 0, sizeof rc_cfg);
    rc_cfg.be = &s.sel.api;
    rc_cfg.mvt = mvt;
    rc_cfg.model = s.sel.model;
    rc_cfg.ck = s.ck;
    rc_cfg.model_dir = dir;
    rc_cfg.max_batch_tokens = s.cfg->sched_max_batch_tokens;
    rc_cfg.max_seqs = 1;
    rc_cfg.kv_block_size = s.cfg->kv_block_size;
    rc_cfg.kv_memory = s.cfg->kv_memory_bytes;
    rc_cfg.kv_dtype = s.cfg->kv_dtype;
    rc_cfg.no_graphs = !s.cfg->sched_graphs;
    rc_cfg.overlap = s.cfg->sched_overlap;
    if (runner_create(&rc_cfg, &s.runner) != BERTH_OK) goto out_fail;

    if (runner_generate(s.runner, a.prompt, a.n_prompt, &a.gen, s.logits,
                        s.text ? prompt_stream_on_token : NULL, s.text, &s.gen) != BERTH_OK)
        goto out_fail;

    if (s.dump) {
        size_t n = (size_t)a.n_prompt * (size_t)info.vocab_size;
        /* Raw little-endian float32: the host's own order on every platform berth targets (checked here). */
        const uint32_t one = 1;
        if (*(const uint8_t *)&one != 1) {
            berth_fail(BERTH_E_UNSUPPORTED, "--dump-logits: big-endian hosts are not supported");
            goto out_fail;
        }
        int bad = fwrite(s.logits, sizeof *s.logits, n, s.dump) != n;
        bad |= fclose(s.dump) != 0;
        s.dump = NULL;
        if (bad) {
            berth_fail(BERTH_E_IO, "--dump-logits %s: write failed: %s", a.dump_path, strerror(errno));
            goto out_fail;
        }
    }
    const char *gen_text = NULL;
    size_t gen_text_len = 0;
    if (s.text && prompt_stream_finish(s.text, &gen_text, &gen_text_len) != BERTH_OK) goto out_fail;
    exit_code = print_result(&a, &s.gen, s.runner, &s.sel, gen_text, gen_text_len);
    if (exit_code) berth_fail(BERTH_E_IO, "cannot write the result to stdout");
    if (exit_code) goto out_fail;
    gen_release(&s);
    free(a.prompt);
    return 0;

out_fail:
    free(a.prompt);
    return fail(&s);
}

/*
 * cmd_generate_batch.c — `berth generate --prompts-file FILE`: every prompt of FILE (one a line: comma-separated
 * token ids; blank lines and lines starting with '#' skipped) submitted at once to the serving engine (berth.h),
 * so they run concurrently with continuous batching and share cached prefixes.
 *
 * Output, in input order: without --json one line per prompt, the generated ids space separated; with --json one
 * object per line: {"index", "tokens", "prompt_tokens", "cached_tokens", "finish_reason"}. --stats prints the
 * engine's counters as one JSON object {"stats": {...}} on stderr at the end.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "berth.h"
#include "commands.h"
#include "errors.h"
#include "host_services.h"
#include "prompt_text.h"
#include "runner.h"

/* Engine events carry at most BERTH_MAX_TOP_LOGPROBS top entries; they are kept in runner_sample_out. */
_Static_assert(BERTH_MAX_TOP_LOGPROBS <= RUNNER_MAX_TOP_LOGPROBS, "top logprobs of an event must fit");

static const char batch_usage[] =
    "usage: berth generate --config FILE [--model DIR] --prompts-file FILE [OPTIONS]\n"
    "  --prompts-file FILE    one prompt a line (token ids comma separated, or text encoded with the checkpoint's\n"
    "                         tokenizer.json); all run concurrently\n"
    "  --max-new-tokens N     tokens to generate at most per prompt (default 32)\n"
    "  --temperature T, --top-k K, --top-p P, --min-p P, --repetition-penalty R, --presence-penalty P,\n"
    "  --frequency-penalty F, --seed S, --ignore-eos   as for one prompt\n"
    "  --json                 one JSON object per prompt, in input order, with cached_tokens\n"
    "  --logprobs N           with --json: each token's logprob and the N (0..20) most likely tokens' logprobs\n"
    "  --stats                print the engine's counters ({\"stats\": {...}}) on stderr\n";

struct batch_prompt {
    int32_t *ids;
    int32_t n;
    int32_t *out;
    int32_t n_out, cap_out;
    struct runner_sample_out *lp; /* with --logprobs: one per generated token */
    int32_t cached;
    char finish[16];
    char message[256];
    berth_status status;
    int done;
    int oom;            /* a token could not be kept (out of host memory) */
};

struct batch {
    struct batch_prompt *p;
    int32_t n;
    int logprobs;       /* --logprobs given */
    int32_t n_done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t first_id;
};

static int bad_usage(const char *fmt, const char *arg)
{
    fputs("berth generate: ", stderr);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", batch_usage);
    return 2;
}

/* One line "2, 17,99" -> ids. -1 on a bad item. */
static int parse_line(const char *line, int32_t **ids, int32_t *n)
{
    size_t cap = 1;
    for (const char *q = line; *q; q++) cap += *q == ',';
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    int32_t k = 0;
    const char *q = line;
    for (;;) {
        char *end;
        errno = 0;
        long long x = strtoll(q, &end, 10);
        if (end == q || errno || x < INT32_MIN || x > INT32_MAX) goto bad;
        v[k++] = (int32_t)x;
        while (*end == ' ' || *end == '\t') end++;
        if (*end == '\0') break;
        if (*end != ',') goto bad;
        q = end + 1;
    }
    *ids = v;
    *n = k;
    return 0;
bad:
    free(v);
    return -1;
}

/* A line that is not an id list is text: encode it with the checkpoint's tokenizer (BOS added, as
 * transformers' tokenizer(text) does), loaded on first use. */
static berth_status encode_text_line(const char *path, int lineno, const char *model_dir, berth_tokenizer **tok,
                                     const char *text, int32_t **ids, int32_t *n)
{
    if (!*tok) {
        if (!model_dir)
            return berth_fail(BERTH_E_INVALID, "--prompts-file %s:%d: a text prompt needs --model DIR (for its "
                              "tokenizer.json)", path, lineno);
        if (prompt_tokenizer_open(model_dir, 1, tok) != BERTH_OK)
            return berth_fail(BERTH_E_INVALID, "--prompts-file %s:%d: not a comma-separated list of token ids, and "
                              "text needs the tokenizer: %s", path, lineno, berth_last_error());
    }
    if (prompt_encode(*tok, text, 1, ids, n) != BERTH_OK)
        return berth_fail(BERTH_E_INVALID, "--prompts-file %s:%d: %s", path, lineno, berth_last_error());
    return BERTH_OK;
}

/* One prompt a line: comma-separated ids, or text (encoded with the checkpoint's tokenizer). */
static berth_status read_prompts(const char *path, const char *model_dir, struct batch *b)
{
    berth_tokenizer *tok = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return berth_fail(BERTH_E_IO, "--prompts-file %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    berth_status st = BERTH_OK;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s || *s == '#') continue;
        struct batch_prompt *np = realloc(b->p, (size_t)(b->n + 1) * sizeof *np);
        if (!np) {
            st = berth_fail(BERTH_E_NOMEM, "out of host memory");
            break;
        }
        b->p = np;
        memset(&b->p[b->n], 0, sizeof b->p[b->n]);
        if (parse_line(s, &b->p[b->n].ids, &b->p[b->n].n) &&
            (st = encode_text_line(path, lineno, model_dir, &tok, s, &b->p[b->n].ids, &b->p[b->n].n)) != BERTH_OK)
            break;
        b->n++;
    }
    free(line);
    fclose(f);
    tok_free(tok);
    if (!st && b->n == 0) st = berth_fail(BERTH_E_INVALID, "--prompts-file %s holds no prompt", path);
    return st;
}

static void on_event(void *arg, const berth_engine_event *ev)
{
    struct batch *b = arg;
    pthread_mutex_lock(&b->mu); /* held by the submitter until first_id is known */
    int64_t k = ev->request_id - b->first_id;
    if (k < 0 || k >= b->n) {
        pthread_mutex_unlock(&b->mu);
        return;
    }
    struct batch_prompt *p = &b->p[k];
    if (ev->kind == BERTH_EVENT_TOKEN) {
        if (p->n_out == p->cap_out) {
            int32_t cap = p->cap_out ? p->cap_out * 2 : 32;
            int32_t *o = realloc(p->out, (size_t)cap * sizeof *o);
            if (o) p->out = o;
            struct runner_sample_out *l = o && b->logprobs ? realloc(p->lp, (size_t)cap * sizeof *l) : NULL;
            if (l) p->lp = l;
            if (o && (!b->logprobs || l)) p->cap_out = cap; /* else the token is dropped: reported below */
        }
        if (p->n_out < p->cap_out) {
            if (b->logprobs) {
                struct runner_sample_out *l = &p->lp[p->n_out];
                l->logprob = ev->has_logprob ? ev->logprob : NAN;
                l->n_top = ev->has_logprob ? ev->n_top : 0;
                for (int32_t j = 0; j < l->n_top; j++) {
                    l->top_ids[j] = ev->top_ids[j];
                    l->top_logprobs[j] = ev->top_logprobs[j];
                }
            }
            p->out[p->n_out++] = ev->token;
        } else {
            p->oom = 1;
        }
    } else {
        p->done = 1;
        p->cached = ev->cached_tokens;
        p->status = ev->status;
        snprintf(p->finish, sizeof p->finish, "%s", ev->finish_reason);
        snprintf(p->message, sizeof p->message, "%s", ev->message ? ev->message : "");
        b->n_done++;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

static void print_stats(berth_engine *e)
{
    berth_engine_stats st;
    st.struct_size = sizeof st;
    if (berth_engine_get_stats(e, &st) != BERTH_OK) return;
    json_t *o = json_object();
    json_object_set_new(o, "steps", json_integer(st.steps));
    json_object_set_new(o, "prefill_tokens", json_integer(st.prefill_tokens));
    json_object_set_new(o, "recomputed_tokens", json_integer(st.recomputed_tokens));
    json_object_set_new(o, "cached_tokens", json_integer(st.cached_tokens));
    json_object_set_new(o, "decode_rows", json_integer(st.decode_rows));
    json_object_set_new(o, "mixed_steps", json_integer(st.mixed_steps));
    json_object_set_new(o, "preemptions", json_integer(st.preemptions));
    json_object_set_new(o, "forks", json_integer(st.forks));
    json_object_set_new(o, "finished", json_integer(st.finished));
    json_t *pools = json_object();
    for (int32_t g = 0; g < st.n_pools && g < 8; g++) {
        json_t *pg = json_object();
        json_object_set_new(pg, "in_use", json_integer(st.blocks_in_use[g]));
        json_object_set_new(pg, "cached", json_integer(st.blocks_cached[g]));
        json_object_set_new(pg, "total", json_integer(st.blocks_total[g]));
        json_object_set_new(pools, st.pool_names[g], pg);
    }
    json_object_set_new(o, "kv_blocks", pools);
    json_t *root = json_object();
    json_object_set_new(root, "stats", o);
    char *s = json_dumps(root, JSON_COMPACT);
    if (s) fprintf(stderr, "%s\n", s);
    free(s);
    json_decref(root);
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cmd_generate_batch(int argc, char **argv)
{
    const char *config = NULL, *model = NULL, *file = NULL;
    int json = 0, stats = 0;
    berth_engine_request rq;
    memset(&rq, 0, sizeof rq);
    rq.struct_size = sizeof rq;
    rq.max_new_tokens = 32;
    rq.top_p = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        const char *eq = strchr(a, '=');
        char name[64];
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        if (nl >= sizeof name) return bad_usage("unknown option '%s'", a);
        memcpy(name, a, nl);
        name[nl] = 0;
        int takes = !strcmp(name, "--config") || !strcmp(name, "--model") || !strcmp(name, "--prompts-file") ||
                    !strcmp(name, "--max-new-tokens") || !strcmp(name, "--temperature") ||
                    !strcmp(name, "--top-k") || !strcmp(name, "--top-p") || !strcmp(name, "--seed") ||
                    !strcmp(name, "--min-p") || !strcmp(name, "--repetition-penalty") ||
                    !strcmp(name, "--presence-penalty") || !strcmp(name, "--frequency-penalty") ||
                    !strcmp(name, "--logprobs");
        if (takes) {
            if (eq)
                v = eq + 1;
            else if (i + 1 < argc)
                v = argv[++i];
            else
                return bad_usage("%s needs a value", name);
        }
        double x;
        if (!strcmp(name, "--config"))
            config = v;
        else if (!strcmp(name, "--model"))
            model = v;
        else if (!strcmp(name, "--prompts-file"))
            file = v;
        else if (!strcmp(name, "--max-new-tokens")) {
            if (parse_num(v, 0, INT32_MAX, &x) || x != floor(x)) return bad_usage("--max-new-tokens '%s' is not a count", v);
            rq.max_new_tokens = (int32_t)x;
        } else if (!strcmp(name, "--temperature")) {
            if (parse_num(v, 0, 100, &x)) return bad_usage("--temperature '%s' is not in [0, 100]", v);
            rq.temperature = (float)x;
        } else if (!strcmp(name, "--top-k")) {
            if (parse_num(v, 0, INT32_MAX, &x) || x != floor(x)) return bad_usage("--top-k '%s' is not a count", v);
            rq.top_k = (int32_t)x;
        } else if (!strcmp(name, "--top-p")) {
            if (parse_num(v, 1e-9, 1, &x)) return bad_usage("--top-p '%s' is not in (0, 1]", v);
            rq.top_p = (float)x;
        } else if (!strcmp(name, "--min-p")) {
            if (parse_num(v, 0, 1, &x)) return bad_usage("--min-p '%s' is not a number in [0, 1]", v);
            rq.min_p = (float)x;
        } else if (!strcmp(name, "--repetition-penalty")) {
            if (parse_num(v, 1e-30, 1e30, &x)) return bad_usage("--repetition-penalty '%s' is not a number > 0", v);
            rq.repetition_penalty = (float)x;
        } else if (!strcmp(name, "--logprobs")) {
            if (parse_num(v, 0, BERTH_MAX_TOP_LOGPROBS, &x) || x != floor(x))
                return bad_usage("--logprobs '%s' is not a count in 0..20", v);
            rq.logprobs = 1;
            rq.top_logprobs = (int32_t)x;
        } else if (!strcmp(name, "--presence-penalty")) {
            if (parse_num(v, -1e30, 1e30, &x)) return bad_usage("--presence-penalty '%s' is not a number", v);
            rq.presence_penalty = (float)x;
        } else if (!strcmp(name, "--frequency-penalty")) {
            if (parse_num(v, -1e30, 1e30, &x)) return bad_usage("--frequency-penalty '%s' is not a number", v);
            rq.frequency_penalty = (float)x;
        } else if (!strcmp(name, "--seed")) {
            if (parse_num(v, 0, 18446744073709551615.0, &x) || x != floor(x))
                return bad_usage("--seed '%s' is not a non-negative integer", v);
            rq.seed = (uint64_t)x;
        } else if (!strcmp(name, "--ignore-eos") && !eq)
            rq.ignore_eos = 1;
        else if (!strcmp(name, "--json") && !eq)
            json = 1;
        else if (!strcmp(name, "--stats") && !eq)
            stats = 1;
        else if (!strcmp(name, "-v") || !strcmp(name, "-vv"))
            ;
        else if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
            fputs(batch_usage, stdout);
            return 0;
        }
        else
            return bad_usage("unknown option '%s'", a);
    }
    if (!config) return bad_usage("%s", "--config FILE is required");
    if (!file) return bad_usage("%s", "--prompts-file FILE is required");
    if (rq.logprobs && !json) return bad_usage("%s", "--logprobs needs --json (the logprobs are JSON fields)");

    struct batch b;
    memset(&b, 0, sizeof b);
    b.logprobs = rq.logprobs != 0;
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    berth_engine *e = NULL;
    int rc = 1;
    if (read_prompts(file, model, &b) != BERTH_OK) goto out;
    berth_engine_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.config_path = config;
    c.model_dir = model;
    c.queue_capacity = b.n;
    if (berth_engine_create(&c, &e) != BERTH_OK) goto out;
    pthread_mutex_lock(&b.mu);
    /* Held until every prompt is queued: the first step plans them all (as many as the batch budget takes), not
     * only those that arrived before the engine thread woke. */
    berth_engine_hold(e, 1);
    for (int32_t i = 0; i < b.n; i++) {
        rq.prompt = b.p[i].ids;
        rq.n_prompt = b.p[i].n;
        int64_t id;
        if (berth_engine_submit(e, &rq, on_event, &b, &id) != BERTH_OK) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s", berth_last_error());
            berth_fail(BERTH_E_INVALID, "prompt %d of %s: %s", (int)i + 1, file, msg);
            pthread_mutex_unlock(&b.mu);
            /* the ones already submitted finish (cancelled) in berth_engine_destroy */
            goto out;
        }
        if (i == 0) b.first_id = id;
        /* ids are consecutive for one submitter: the engine hands them out in submission order */
    }
    berth_engine_hold(e, 0);
    while (b.n_done < b.n) pthread_cond_wait(&b.cv, &b.mu);
    pthread_mutex_unlock(&b.mu);
    rc = 0;
    for (int32_t i = 0; i < b.n; i++) {
        struct batch_prompt *p = &b.p[i];
        if (p->status != BERTH_OK) {
            berth_fail(p->status, "prompt %d: %s", (int)i + 1, p->message);
            rc = 1;
            break;
        }
        if (p->oom) {
            berth_fail(BERTH_E_NOMEM, "prompt %d: out of host memory keeping its tokens", (int)i + 1);
            rc = 1;
            break;
        }
        if (json) {
            json_t *o = json_object(), *t = json_array();
            for (int32_t k = 0; k < p->n_out; k++) json_array_append_new(t, json_integer(p->out[k]));
            json_object_set_new(o, "index", json_integer(i));
            json_object_set_new(o, "tokens", t);
            json_object_set_new(o, "prompt_tokens", json_integer(p->n));
            json_object_set_new(o, "cached_tokens", json_integer(p->cached));
            if (b.logprobs)
                json_object_set_new(o, "logprobs", generate_logprobs_json(p->out, p->lp, p->n_out));
            json_object_set_new(o, "finish_reason", json_string(p->finish));
            char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
            if (s) printf("%s\n", s);
            free(s);
            json_decref(o);
        } else {
            for (int32_t k = 0; k < p->n_out; k++) printf(k ? " %d" : "%d", (int)p->out[k]);
            printf("\n");
        }
    }
    if (stats) print_stats(e);
out:
    if (rc) host_log(BERTH_LOG_ERROR, "%s", berth_last_error()[0] ? berth_last_error() : "failed");
    berth_engine_destroy(e);
    for (int32_t i = 0; i < b.n; i++) {
        free(b.p[i].ids);
        free(b.p[i].out);
        free(b.p[i].lp);
    }
    free(b.p);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    return rc;
}

/* test_generate_cli.c — `berth generate` end to end, run as a child process (the real binary, so a crash or a
 * sanitizer report fails the test).
 *
 * Every bad input must give exit status 1 (2 for bad usage) and exactly one line on stderr — the message asserted
 * here verbatim — never a crash. The bad checkpoints are built at runtime by writing a small random Gemma 4
 * checkpoint (gemma4_text, 2 layers: sliding + full) into a scratch folder and breaking one thing in it. The good
 * path checks the printed tokens, --json, --dump-logits and seeded sampling on the same checkpoint; with
 * reference fixtures present it also checks --dump-logits and the greedy tokens against transformers.
 *
 * argv[1] = path of the berth binary, argv[2] = the parity config (CPU backend only). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_gemma4_fixture.h"
#include "check_run.h"

static const char *berth_bin, *config_path;

#define RUN_LIMIT_S 30 /* one berth run on the tiny checkpoints takes well under a second (a few under ASan) */

/* ---- scratch folders ------------------------------------------------------------------------------------------ */
static char *scratch_new(void)
{
    const char *base = getenv("TMPDIR");
    char buf[512];
    snprintf(buf, sizeof buf, "%s/berth-gen-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(buf);
    ck_assert_msg(d != NULL, "mkdtemp: %s", strerror(errno));
    return strdup(d);
}

static void scratch_free(char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char *p = g4_join(dir, e->d_name);
            unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    if (len) *len = got;
    return s;
}

/* ---- running berth -------------------------------------------------------------------------------------------- */
struct result {
    int status; /* exit status, or 128 + signal */
    char *out, *err;
};

static void result_free(struct result *r)
{
    free(r->out);
    free(r->err);
}

/* Run berth generate with args (NULL-terminated); stdout/stderr captured through files in work. */
static struct result run_generate(const char *work, const char *const *args)
{
    const char *argv[64];
    int n = 0;
    argv[n++] = berth_bin;
    argv[n++] = "generate";
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    char *out_path = g4_join(work, "stdout.txt"), *err_path = g4_join(work, "stderr.txt");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0) dup2(nul, 0); /* not a terminal: no progress line */
        execv(berth_bin, (char *const *)argv);
        _exit(127);
    }
    /* A hang is a failure too: give each run RUN_LIMIT_S seconds, then kill it and say so. */
    int ws = 0, hung = 0;
    for (int waited_ms = 0;; waited_ms += 10) {
        pid_t got = waitpid(pid, &ws, WNOHANG);
        ck_assert_int_ge(got, 0);
        if (got == pid) break;
        if (waited_ms >= RUN_LIMIT_S * 1000) {
            kill(pid, SIGKILL);
            ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
            hung = 1;
            break;
        }
        usleep(10000);
    }
    ck_assert_msg(!hung, "berth generate did not finish within %d s (killed): a hang", RUN_LIMIT_S);
    struct result r;
    r.status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    r.out = read_text(out_path, NULL);
    r.err = read_text(err_path, NULL);
    unlink(out_path);
    unlink(err_path);
    free(out_path);
    free(err_path);
    return r;
}

/* Exit status 1 and stderr exactly "berth: error: <msg>\n". */
static void expect_error(const struct result *r, const char *msg)
{
    char want[4096];
    snprintf(want, sizeof want, "berth: error: %s\n", msg);
    ck_assert_msg(r->status == 1 && strcmp(r->err, want) == 0,
                  "expected exit 1 and\n  %s got exit %d and\n  %s", want, r->status, r->err);
    ck_assert_str_eq(r->out, "");
}

/* ---- a small random Gemma 4 checkpoint -------------------------------------------------------------------------- */
#define V 64
#define D 32
#define H 2
#define KVH 1
#define HD 16
#define FF 64
#define MAXPOS 64

struct ck_opts {
    const char *model_type;   /* default gemma4_text */
    const char *drop;         /* tensor left out */
    const char *misshape;     /* tensor whose last dimension is one larger */
    uint64_t huge_bytes;      /* an extra (sparse) tensor outside the text decoder of this many bytes */
};

struct tspec {
    char name[96];
    int ndim;
    int64_t shape[2];
    int kind; /* 0 weight, 1 norm weight, 2 layer scalar */
};

static int tensor_list(struct tspec *t)
{
    int n = 0;
#define T(k, nd, a, b, ...)                                                                                     \
    do {                                                                                                        \
        snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                                                     \
        t[n].ndim = nd, t[n].shape[0] = a, t[n].shape[1] = b, t[n].kind = k, n++;                               \
    } while (0)
    T(0, 2, V, D, "model.embed_tokens.weight");
    T(1, 1, D, 0, "model.norm.weight");
    for (int i = 0; i < 2; i++) {
        T(1, 1, D, 0, "model.layers.%d.input_layernorm.weight", i);
        T(0, 2, H * HD, D, "model.layers.%d.self_attn.q_proj.weight", i);
        T(1, 1, HD, 0, "model.layers.%d.self_attn.q_norm.weight", i);
        T(0, 2, KVH * HD, D, "model.layers.%d.self_attn.k_proj.weight", i);
        T(0, 2, KVH * HD, D, "model.layers.%d.self_attn.v_proj.weight", i);
        T(1, 1, HD, 0, "model.layers.%d.self_attn.k_norm.weight", i);
        T(0, 2, D, H * HD, "model.layers.%d.self_attn.o_proj.weight", i);
        T(1, 1, D, 0, "model.layers.%d.post_attention_layernorm.weight", i);
        T(1, 1, D, 0, "model.layers.%d.pre_feedforward_layernorm.weight", i);
        T(0, 2, FF, D, "model.layers.%d.mlp.gate_proj.weight", i);
        T(0, 2, FF, D, "model.layers.%d.mlp.up_proj.weight", i);
        T(0, 2, D, FF, "model.layers.%d.mlp.down_proj.weight", i);
        T(1, 1, D, 0, "model.layers.%d.post_feedforward_layernorm.weight", i);
        T(2, 1, 1, 0, "model.layers.%d.layer_scalar", i);
    }
#undef T
    return n;
}

static void write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char *p = g4_join(dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", p);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
    free(p);
}

static void write_config(const char *dir, const char *model_type)
{
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"%s\", \"architectures\": [\"Gemma4ForCausalLM\"], \"vocab_size\": %d, "
             "\"vocab_size_per_layer_input\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
             "\"global_head_dim\": %d, \"layer_types\": [\"sliding_attention\", \"full_attention\"], "
             "\"sliding_window\": 4, \"rms_norm_eps\": 1e-06, \"hidden_size_per_layer_input\": 0, "
             "\"num_kv_shared_layers\": 0, \"final_logit_softcapping\": 30.0, \"tie_word_embeddings\": true, "
             "\"max_position_embeddings\": %d, \"bos_token_id\": 2, \"eos_token_id\": 1, \"pad_token_id\": 0, "
             "\"hidden_activation\": \"gelu_pytorch_tanh\"}",
             model_type, V, V, D, FF, H, KVH, HD, HD, MAXPOS);
    write_file(dir, "config.json", cfg, strlen(cfg));
}

static uint64_t rng_state;
static float rng_uniform(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* Write dir/config.json and dir/model.safetensors (f32). Returns the size of the data section. */
static uint64_t write_checkpoint(const char *dir, const struct ck_opts *o)
{
    write_config(dir, o->model_type ? o->model_type : "gemma4_text");
    struct tspec t[64];
    int n = tensor_list(t);
    rng_state = 12345;
    size_t hcap = 16384, hlen = 0;
    char *hdr = malloc(hcap);
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "{\"__metadata__\": {\"format\": \"pt\"}");
    uint64_t off = 0;
    size_t data_cap = 0;
    for (int i = 0; i < n; i++) {
        if (o->drop && strcmp(o->drop, t[i].name) == 0) continue;
        if (o->misshape && strcmp(o->misshape, t[i].name) == 0) t[i].shape[t[i].ndim - 1]++;
        uint64_t count = (uint64_t)t[i].shape[0] * (uint64_t)(t[i].ndim > 1 ? t[i].shape[1] : 1);
        if (t[i].ndim == 1)
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen,
                                     ", \"%s\": {\"dtype\": \"F32\", \"shape\": [%lld], \"data_offsets\": [%llu, %llu]}",
                                     t[i].name, (long long)t[i].shape[0], (unsigned long long)off,
                                     (unsigned long long)(off + count * 4));
        else
            hlen += (size_t)snprintf(hdr + hlen, hcap - hlen,
                                     ", \"%s\": {\"dtype\": \"F32\", \"shape\": [%lld, %lld], \"data_offsets\": [%llu, "
                                     "%llu]}",
                                     t[i].name, (long long)t[i].shape[0], (long long)t[i].shape[1],
                                     (unsigned long long)off, (unsigned long long)(off + count * 4));
        off += count * 4;
        data_cap = off;
    }
    uint64_t dense_end = off;
    if (o->huge_bytes) {
        hlen += (size_t)snprintf(hdr + hlen, hcap - hlen,
                                 ", \"vision_tower.huge.weight\": {\"dtype\": \"U8\", \"shape\": [%llu], "
                                 "\"data_offsets\": [%llu, %llu]}",
                                 (unsigned long long)o->huge_bytes, (unsigned long long)off,
                                 (unsigned long long)(off + o->huge_bytes));
        off += o->huge_bytes;
    }
    hlen += (size_t)snprintf(hdr + hlen, hcap - hlen, "}");
    while (hlen % 8) hdr[hlen++] = ' ';
    ck_assert_uint_lt(hlen, hcap);

    float *data = malloc(data_cap ? data_cap : 4);
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (o->drop && strcmp(o->drop, t[i].name) == 0) continue;
        uint64_t count = (uint64_t)t[i].shape[0] * (uint64_t)(t[i].ndim > 1 ? t[i].shape[1] : 1);
        for (uint64_t j = 0; j < count; j++)
            data[k++] = t[i].kind == 0 ? 0.15f * rng_uniform() : t[i].kind == 1 ? 1.0f + 0.25f * rng_uniform() : 0.9f;
    }
    char *p = g4_join(dir, "model.safetensors");
    FILE *f = fopen(p, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", p);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    ck_assert_uint_eq(fwrite(len8, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(hdr, 1, hlen, f), hlen);
    ck_assert_uint_eq(fwrite(data, 1, dense_end, f), dense_end);
    fclose(f);
    if (o->huge_bytes) ck_assert_msg(truncate(p, (off_t)(8 + hlen + off)) == 0, "truncate: %s", strerror(errno));
    free(p);
    free(data);
    free(hdr);
    return off;
}

static char *work;   /* scratch folder of the current test */
static char *model;  /* work/model */

static void setup(void)
{
    work = scratch_new();
    model = g4_join(work, "model");
    ck_assert_int_eq(mkdir(model, 0755), 0);
}

static void teardown(void)
{
    scratch_free(model);
    scratch_free(work);
}

#define GEN(...)                                                                                                \
    run_generate(work, (const char *const[]){"--config", config_path, "--model", model, __VA_ARGS__, NULL})

/* ---- bad usage ---------------------------------------------------------------------------------------------- */
START_TEST(test_usage_errors)
{
    struct result r = run_generate(work, (const char *const[]){"--config", config_path, "--model", model, NULL});
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strncmp(r.err, "berth generate: --prompt-ids LIST is required\nusage: berth generate", 66) == 0,
                  "%s", r.err);
    result_free(&r);
    r = GEN("--prompt-ids", "2,x,3");
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strncmp(r.err, "berth generate: --prompt-ids '2,x,3' is not a comma-separated list of integers\n",
                          79) == 0, "%s", r.err);
    result_free(&r);
    r = GEN("--prompt-ids", "2,,3");
    ck_assert_int_eq(r.status, 2);
    result_free(&r);
    r = GEN("--prompt-ids", "2", "--max-new-tokens", "-1");
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strncmp(r.err, "berth generate: --max-new-tokens '-1' is not a count >= 0\n", 58) == 0, "%s",
                  r.err);
    result_free(&r);
    r = GEN("--prompt-ids", "2", "--top-p", "0");
    ck_assert_int_eq(r.status, 2);
    result_free(&r);
    r = GEN("--prompt-ids", "2", "--bogus");
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strncmp(r.err, "berth generate: unknown argument '--bogus'\n", 43) == 0, "%s", r.err);
    result_free(&r);
    r = GEN("--prompt-ids");
    ck_assert_int_eq(r.status, 2);
    ck_assert_msg(strncmp(r.err, "berth generate: --prompt-ids needs a value\n", 43) == 0, "%s", r.err);
    result_free(&r);
}
END_TEST

/* ---- bad input: one line, exit 1 ------------------------------------------------------------------------------ */
START_TEST(test_unknown_model_type)
{
    struct ck_opts o = {.model_type = "llama"};
    write_checkpoint(model, &o);
    struct result r = GEN("--prompt-ids", "2,17,9");
    char msg[1024];
    snprintf(msg, sizeof msg, "no model plugin accepts %s (model_type 'llama'): gemma4: declined: model_type 'llama' "
             "is not handled by gemma4 (handles gemma4_text, gemma4)", model);
    expect_error(&r, msg);
    result_free(&r);
}
END_TEST

START_TEST(test_missing_tensor)
{
    struct ck_opts o = {.drop = "model.layers.1.mlp.down_proj.weight"};
    write_checkpoint(model, &o);
    struct result r = GEN("--prompt-ids", "2,17,9");
    char msg[1024];
    snprintf(msg, sizeof msg, "%s: missing tensor 'model.layers.1.mlp.down_proj.weight'", model);
    expect_error(&r, msg);
    result_free(&r);
}
END_TEST

START_TEST(test_misshaped_tensor)
{
    struct ck_opts o = {.misshape = "model.layers.0.self_attn.q_proj.weight"};
    write_checkpoint(model, &o);
    struct result r = GEN("--prompt-ids", "2,17,9");
    char msg[1024];
    /* the message names the shard file that holds the tensor (berth_tensor_info.file) */
    snprintf(msg, sizeof msg, "%s/model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' has shape "
             "[32, 33], expected [32, 32]", model);
    expect_error(&r, msg);
    result_free(&r);
}
END_TEST

START_TEST(test_truncated_safetensors)
{
    struct ck_opts o = {0};
    uint64_t data = write_checkpoint(model, &o);
    char *p = g4_join(model, "model.safetensors");
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    /* Two bytes short: only the last tensor (layer 1's 4-byte layer_scalar) runs past the end. */
    ck_assert_int_eq(truncate(p, sb.st_size - 2), 0);
    struct result r = GEN("--prompt-ids", "2,17,9");
    char msg[1024];
    snprintf(msg, sizeof msg, "%s: tensor 'model.layers.1.layer_scalar': data_offsets end %llu is past the end of the "
             "data section (%llu bytes; truncated file?)", p, (unsigned long long)data,
             (unsigned long long)(data - 2));
    expect_error(&r, msg);
    result_free(&r);

    /* A header whose length field claims more than the file holds. */
    FILE *f = fopen(p, "r+b");
    unsigned char len8[8] = {0xff, 0xff, 0xff, 0x00, 0, 0, 0, 0};
    ck_assert_uint_eq(fwrite(len8, 1, 8, f), 8);
    fclose(f);
    r = GEN("--prompt-ids", "2,17,9");
    snprintf(msg, sizeof msg, "%s: header length 16777215 is larger than the file (%llu bytes after the length field)",
             p, (unsigned long long)(sb.st_size - 2 - 8));
    expect_error(&r, msg);
    result_free(&r);
    free(p);
}
END_TEST

START_TEST(test_token_outside_vocab)
{
    struct ck_opts o = {0};
    write_checkpoint(model, &o);
    struct result r = GEN("--prompt-ids", "2,17,64");
    expect_error(&r, "token id 64 at prompt position 2 is outside the vocabulary (size 64)");
    result_free(&r);
    r = GEN("--prompt-ids", "2,-3");
    expect_error(&r, "token id -3 at prompt position 1 is outside the vocabulary (size 64)");
    result_free(&r);
}
END_TEST

START_TEST(test_prompt_too_long)
{
    struct ck_opts o = {0};
    write_checkpoint(model, &o);
    struct result r = GEN("--prompt-ids", "2,3,4,5,6,7,8,9,10,11", "--max-new-tokens", "55");
    char msg[1024];
    snprintf(msg, sizeof msg, "prompt of 10 tokens + 55 new tokens exceeds the context limit of 64 "
             "(max_position_embeddings in %s/config.json)", model);
    expect_error(&r, msg);
    result_free(&r);
}
END_TEST

START_TEST(test_does_not_fit)
{
    /* 2 TB of (sparse) weights: more than any test machine's memory. */
    struct ck_opts o = {.huge_bytes = 2000000000000ull};
    write_checkpoint(model, &o);
    struct result r = GEN("--prompt-ids", "2,17,9");
    char prefix[1024];
    snprintf(prefix, sizeof prefix, "berth: error: model %s: weights need 2000.00 GB but backend 'cpu' (", model);
    ck_assert_int_eq(r.status, 1);
    size_t n = strlen(r.err);
    const char *suffix = " GB available\n";
    ck_assert_msg(strncmp(r.err, prefix, strlen(prefix)) == 0 && n > strlen(suffix) &&
                      strcmp(r.err + n - strlen(suffix), suffix) == 0 && strchr(r.err, '\n') == r.err + n - 1,
                  "got: %s", r.err);
    ck_assert_str_eq(r.out, "");
    result_free(&r);
}
END_TEST

/* ---- good input ------------------------------------------------------------------------------------------------ */
START_TEST(test_generate_outputs)
{
    struct ck_opts o = {0};
    write_checkpoint(model, &o);
    char *dump = g4_join(work, "logits.f32");
    struct result r = GEN("--prompt-ids", "2,17,9,40", "--max-new-tokens", "6", "--ignore-eos", "--dump-logits", dump);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_str_eq(r.err, "");
    /* One line of 6 ids. */
    int ids[6], used = 0, nread = 0;
    const char *s = r.out;
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(sscanf(s, "%d%n", &ids[i], &used), 1);
        ck_assert_int_ge(ids[i], 0);
        ck_assert_int_lt(ids[i], V);
        s += used;
        nread++;
    }
    ck_assert_str_eq(s, "\n");
    ck_assert_int_eq(nread, 6);

    /* --dump-logits: [4, V] f32, finite, and the greedy first token is the argmax of the last row. */
    float *lg = g4_read_f32(dump, 4, V);
    int best = 0;
    for (int v = 0; v < 4 * V; v++) ck_assert_msg(isfinite(lg[v]), "logit %d not finite", v);
    for (int v = 1; v < V; v++)
        if (lg[3 * V + v] > lg[3 * V + best]) best = v;
    ck_assert_int_eq(ids[0], best);
    free(lg);

    /* --json: the same tokens, and counters that show one prefill and 5 decode steps. */
    struct result j = GEN("--prompt-ids", "2,17,9,40", "--max-new-tokens", "6", "--ignore-eos", "--json");
    ck_assert_msg(j.status == 0, "exit %d: %s", j.status, j.err);
    json_error_t err;
    json_t *root = json_loads(j.out, 0, &err);
    ck_assert_msg(root != NULL, "not JSON: %s (%s)", j.out, err.text);
    ck_assert_int_eq(json_integer_value(json_object_get(root, "prompt_tokens")), 4);
    ck_assert_str_eq(json_string_value(json_object_get(root, "finish_reason")), "length");
    json_t *toks = json_object_get(root, "tokens");
    ck_assert_int_eq(json_array_size(toks), 6);
    for (int i = 0; i < 6; i++) ck_assert_int_eq(json_integer_value(json_array_get(toks, (size_t)i)), ids[i]);
    json_t *stats = json_object_get(root, "stats");
    ck_assert_int_eq(json_integer_value(json_object_get(stats, "prefill_tokens")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(stats, "decode_steps")), 5);
    ck_assert_int_eq(json_integer_value(json_object_get(stats, "forward_calls")), 6);
    ck_assert_str_eq(json_string_value(json_object_get(stats, "backend")), "cpu");
    ck_assert_str_eq(json_string_value(json_object_get(stats, "model_plugin")), "gemma4");
    json_t *model_ctr = json_object_get(stats, "model");
    if (model_ctr) ck_assert_int_eq(json_integer_value(json_object_get(model_ctr, "decode_steps")), 5);
    ck_assert_ptr_nonnull(json_object_get(stats, "kv_blocks_total"));
    json_decref(root);
    result_free(&j);

    /* Seeded sampling is reproducible. */
    struct result a = GEN("--prompt-ids", "2,17,9,40", "--max-new-tokens", "8", "--ignore-eos", "--temperature",
                          "1.5", "--top-k", "20", "--top-p", "0.9", "--seed", "7");
    struct result b = GEN("--prompt-ids", "2,17,9,40", "--max-new-tokens", "8", "--ignore-eos", "--temperature",
                          "1.5", "--top-k", "20", "--top-p", "0.9", "--seed", "7");
    ck_assert_msg(a.status == 0, "exit %d: %s", a.status, a.err);
    ck_assert_int_eq(b.status, 0);
    ck_assert_str_eq(a.out, b.out);
    result_free(&a);
    result_free(&b);
    result_free(&r);
    unlink(dump);
    free(dump);
}
END_TEST

/* ---- against the reference fixtures, when present ------------------------------------------------------------- */
static char **fixture_dirs;
static int n_fixtures;

START_TEST(test_fixture_cli)
{
    struct g4_fixture f;
    g4_load_fixture(fixture_dirs[_i], &f);
    const struct g4_prompt *gp = &f.prompts[0];
    char ids[4096];
    size_t k = 0;
    for (int32_t i = 0; i < gp->n; i++) k += (size_t)snprintf(ids + k, sizeof ids - k, i ? ",%d" : "%d", (int)gp->ids[i]);
    char n_new[16];
    snprintf(n_new, sizeof n_new, "%d", (int)gp->n_greedy);
    char *dump = g4_join(work, "logits.f32");
    struct result r = run_generate(work, (const char *const[]){"--config", config_path, "--model", f.dir,
                                                               "--prompt-ids", ids, "--max-new-tokens", n_new,
                                                               "--ignore-eos", "--json", "--dump-logits", dump, NULL});
    ck_assert_msg(r.status == 0, "%s: exit %d: %s", f.variant, r.status, r.err);
    json_error_t err;
    json_t *root = json_loads(r.out, 0, &err);
    ck_assert_msg(root != NULL, "not JSON: %s", r.out);
    json_t *toks = json_object_get(root, "tokens");
    ck_assert_int_eq(json_array_size(toks), gp->n_greedy);
    for (int32_t i = 0; i < gp->n_greedy; i++)
        ck_assert_msg(json_integer_value(json_array_get(toks, (size_t)i)) == gp->greedy[i],
                      "%s: token %d is %lld, reference %d", f.variant, (int)i,
                      (long long)json_integer_value(json_array_get(toks, (size_t)i)), (int)gp->greedy[i]);
    json_decref(root);
    float *got = g4_read_f32(dump, gp->n, f.vocab), *ref = g4_read_f32(gp->logits_path, gp->n, f.vocab);
    size_t where;
    double m = g4_max_abs(got, ref, (size_t)gp->n * (size_t)f.vocab, &where);
    ck_assert_msg(m <= G4_TOL, "%s: --dump-logits differs from the reference by %.3g", f.variant, m);
    free(got);
    free(ref);
    result_free(&r);
    unlink(dump);
    free(dump);
    g4_free_fixture(&f);
}
END_TEST

static const char *write_dir;
START_TEST(test_write_only)
{
    struct ck_opts o = {0};
    write_checkpoint(write_dir, &o);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write-checkpoint") == 0) {
        /* Debugging aid: write the good test checkpoint into an existing folder (as a test: check asserts). */
        write_dir = argv[2];
        Suite *su = suite_create("write");
        TCase *tc = tcase_create("write");
        tcase_add_test(tc, test_write_only);
        suite_add_tcase(su, tc);
        SRunner *sr = srunner_create(su);
        srunner_set_fork_status(sr, CK_NOFORK);
        srunner_run_all(sr, CK_SILENT);
        int failed = srunner_ntests_failed(sr);
        srunner_free(sr);
        return failed ? 1 : 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s BERTH_BINARY CONFIG | --write-checkpoint DIR\n", argv[0]);
        return 2;
    }
    berth_bin = argv[1];
    config_path = argv[2];
    n_fixtures = g4_list_fixtures(&fixture_dirs);
    Suite *su = suite_create("generate_cli");
    TCase *tc = tcase_create("cli");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_usage_errors);
    tcase_add_test(tc, test_unknown_model_type);
    tcase_add_test(tc, test_missing_tensor);
    tcase_add_test(tc, test_misshaped_tensor);
    tcase_add_test(tc, test_truncated_safetensors);
    tcase_add_test(tc, test_token_outside_vocab);
    tcase_add_test(tc, test_prompt_too_long);
    tcase_add_test(tc, test_does_not_fit);
    tcase_add_test(tc, test_generate_outputs);
    if (n_fixtures > 0)
        tcase_add_loop_test(tc, test_fixture_cli, 0, n_fixtures);
    else
        printf("note: no Gemma 4 fixtures yet: the reference checks of the CLI are not run\n");
    suite_add_tcase(su, tc);
    const int failed = check_run(su, 0);
    g4_free_list(fixture_dirs, n_fixtures);
    return failed ? 1 : 0;
}

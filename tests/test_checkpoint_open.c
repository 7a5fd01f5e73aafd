/* test_checkpoint_open.c — checkpoint directories: config.json errors, sharded checkpoints through
 * model.safetensors.index.json (and each way the index and shards can disagree), tensor_load through a mock
 * backend (zero-copy wrap and upload paths), the "does it fit" check and prefetch. */
#include "test_checkpoint_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include "check_run.h"

static char *dir;

static void setup(void)
{
    dir = tu_mkdtemp();
    memset(&tu_mock, 0, sizeof tu_mock);
}

static void teardown(void) { tu_rmdir(dir); }

static void write_config(void) { tu_write_text(dir, "config.json", "{\"model_type\": \"gemma4_text\"}"); }

/* Shard 1: a [4] f32 = 1..4 and b [2, 3] bf16; shard 2: c [] f32 = 7.5 and d [3] f16. */
static const float a_vals[4] = {1, 2, 3, 4};
static const uint16_t b_vals[6] = {0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0}; /* 1..6 */
static const float c_val = 7.5f;
static const uint16_t d_vals[3] = {0x3C00, 0x4000, 0x4200}; /* 1, 2, 3 */

static void write_shard1(const char *name)
{
    unsigned char data[28];
    memcpy(data, a_vals, 16);
    memcpy(data + 16, b_vals, 12);
    tu_write_st(dir, name,
                "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                " \"b\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [16, 28]}}",
                data, sizeof data);
}

static void write_shard2(const char *name)
{
    unsigned char data[10];
    memcpy(data, &c_val, 4);
    memcpy(data + 4, d_vals, 6);
    tu_write_st(dir, name,
                "{\"__metadata__\": {\"format\": \"pt\"},"
                " \"c\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
                " \"d\": {\"dtype\": \"F16\", \"shape\": [3], \"data_offsets\": [4, 10]}}",
                data, sizeof data);
}

static void write_index(const char *weight_map)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "{\"metadata\": {\"total_size\": 38}, \"weight_map\": %s}", weight_map);
    tu_write_text(dir, "model.safetensors.index.json", buf);
}

static void write_sharded(void)
{
    write_config();
    write_shard1("model-00001-of-00002.safetensors");
    write_shard2("model-00002-of-00002.safetensors");
    write_index("{\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
                " \"c\": \"model-00002-of-00002.safetensors\", \"d\": \"model-00002-of-00002.safetensors\"}");
}

static char *path2(const char *name)
{
    char *p = malloc(1024);
    snprintf(p, 1024, "%s/%s", dir, name);
    return p;
}

/* ---- config.json and directory ---------------------------------------------------------------------- */

START_TEST(missing_directory)
{
    char *p = path2("nope");
    TU_EXPECT_OPEN_FAIL(p, BERTH_E_NOT_FOUND, "%s: No such file or directory", p);
    write_config();
    char *f = path2("config.json");
    TU_EXPECT_OPEN_FAIL(f, BERTH_E_INVALID,
                        "%s: not a directory (expected a checkpoint directory with config.json)", f);
    free(p);
    free(f);
}
END_TEST

START_TEST(missing_config_json)
{
    write_shard1("model.safetensors");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_NOT_FOUND, "%s/config.json: cannot open: No such file or directory", dir);
}
END_TEST

START_TEST(config_json_syntax_error_has_line_and_column)
{
    write_shard1("model.safetensors");
    tu_write_text(dir, "config.json", "{\n  \"model_type\": \"gemma4\",\n  \"hidden_size\": ,\n}\n");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s/config.json:3:18: unexpected token near ','", dir);
    tu_write_text(dir, "config.json", "[1, 2]");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s/config.json: the top level is not a JSON object", dir);
    tu_write_text(dir, "config.json", "");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s/config.json:1:0: '[' or '{' expected near end of file", dir);
}
END_TEST

START_TEST(no_weights)
{
    write_config();
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
}
END_TEST

START_TEST(model_type_and_dir)
{
    write_config();
    write_shard1("model.safetensors");
    char *slashed = path2(""); /* "dir/" */
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(slashed, &ck), BERTH_OK);
    ck_assert_str_eq(ckpt_svc_dir(NULL, ck), dir);
    ck_assert_str_eq(ckpt_model_type(ck), "gemma4_text");
    berth_tensor_info ti = {.struct_size = sizeof ti};
    ck_assert_int_eq(ckpt_svc_tensor_at(NULL, ck, 0, &ti), BERTH_OK);
    ck_assert_str_eq(ti.file, "model.safetensors"); /* single-file layout, directory given with a '/' */
    ckpt_close(ck);
    free(slashed);

    tu_write_text(dir, "config.json", "{\"model_type\": 3}");
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    ck_assert_ptr_null(ckpt_model_type(ck));
    ckpt_close(ck);
    ckpt_close(NULL);
}
END_TEST

/* ---- sharded checkpoints ---------------------------------------------------------------------------- */

START_TEST(sharded_checkpoint_opens)
{
    write_sharded();
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    ck_assert_int_eq(ckpt_svc_tensor_count(NULL, ck), 4);
    ck_assert_uint_eq(ckpt_total_bytes(ck), 38);
    const char *names[4] = {"a", "b", "c", "d"};
    /* file: the shard's name inside the directory, as the index maps each tensor */
    const char *files[4] = {"model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                            "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    berth_tensor_info ti = {.struct_size = sizeof ti};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(ckpt_svc_tensor_at(NULL, ck, i, &ti), BERTH_OK);
        ck_assert_str_eq(ti.name, names[i]);
        ck_assert_str_eq(ti.file, files[i]);
    }
    /* a caller built before ABI 0.2 has no file field: it is not written */
    berth_tensor_info old;
    memset(&old, 0x5a, sizeof old);
    old.struct_size = (uint32_t)BERTH_SIZE_TO(berth_tensor_info, shape);
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "c", &old), BERTH_OK);
    ck_assert_str_eq(old.name, "c");
    const char *untouched;
    memset(&untouched, 0x5a, sizeof untouched);
    ck_assert_ptr_eq(old.file, untouched);
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "c", &ti), BERTH_OK);
    ck_assert_int_eq(ti.dtype, BERTH_DTYPE_F32);
    ck_assert_int_eq(ti.ndim, 0);
    float c;
    memcpy(&c, ti.data, 4);
    ck_assert_float_eq(c, c_val);
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "d", &ti), BERTH_OK);
    for (int i = 0; i < 3; i++) {
        uint16_t h;
        memcpy(&h, (const char *)ti.data + 2 * i, 2);
        ck_assert_float_eq(tu_f16(h), (float)(i + 1));
    }
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "b", &ti), BERTH_OK);
    ck_assert_int_eq(ti.shape[0], 2);
    ck_assert_int_eq(ti.shape[1], 3);
    for (int i = 0; i < 6; i++) {
        uint16_t h;
        memcpy(&h, (const char *)ti.data + 2 * i, 2);
        ck_assert_float_eq(tu_bf16(h), (float)(i + 1));
    }
    ckpt_close(ck);
}
END_TEST

START_TEST(index_wins_over_single_file)
{
    write_sharded();
    write_shard1("model.safetensors"); /* ignored: the index decides */
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    ck_assert_int_eq(ckpt_svc_tensor_count(NULL, ck), 4);
    ckpt_close(ck);
}
END_TEST

START_TEST(index_names_missing_shard)
{
    write_config();
    write_shard1("model-00001-of-00002.safetensors");
    write_index("{\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
                " \"c\": \"model-00002-of-00002.safetensors\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_NOT_FOUND,
                        "%s/model-00002-of-00002.safetensors: cannot open: No such file or directory (shard named in "
                        "%s/model.safetensors.index.json)",
                        dir, dir);
}
END_TEST

START_TEST(index_tensor_missing_from_shard)
{
    write_sharded();
    write_index("{\"a\": \"model-00001-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
                " \"c\": \"model-00002-of-00002.safetensors\", \"d\": \"model-00002-of-00002.safetensors\","
                " \"e\": \"model-00002-of-00002.safetensors\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: tensor 'e' is mapped to "
                        "%s/model-00002-of-00002.safetensors, which does not contain it",
                        dir, dir);
    /* Mapped to the wrong shard. */
    write_index("{\"a\": \"model-00002-of-00002.safetensors\", \"b\": \"model-00001-of-00002.safetensors\","
                " \"c\": \"model-00002-of-00002.safetensors\", \"d\": \"model-00002-of-00002.safetensors\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: tensor 'a' is mapped to "
                        "%s/model-00002-of-00002.safetensors, which does not contain it",
                        dir, dir);
}
END_TEST

START_TEST(shard_tensor_missing_from_index)
{
    write_sharded();
    write_index("{\"a\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\","
                " \"d\": \"model-00002-of-00002.safetensors\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model-00001-of-00002.safetensors: tensor 'b' is not listed in "
                        "%s/model.safetensors.index.json",
                        dir, dir);
}
END_TEST

START_TEST(duplicate_tensor_across_shards)
{
    write_config();
    write_shard1("s1.safetensors");
    write_shard1("s2.safetensors");
    write_index("{\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "tensor 'a' is in both %s/s1.safetensors and %s/s2.safetensors", dir,
                        dir);
}
END_TEST

START_TEST(index_path_traversal_rejected)
{
    write_sharded();
    write_index("{\"a\": \"../model-00001-of-00002.safetensors\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: weight_map: tensor 'a': shard "
                        "\"../model-00001-of-00002.safetensors\" is not a plain file name in the checkpoint directory",
                        dir);
    write_index("{\"a\": \"/etc/passwd\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: weight_map: tensor 'a': shard \"/etc/passwd\" is not a "
                        "plain file name in the checkpoint directory",
                        dir);
    write_index("{\"a\": \"sub/x.safetensors\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: weight_map: tensor 'a': shard \"sub/x.safetensors\" is not "
                        "a plain file name in the checkpoint directory",
                        dir);
    write_index("{\"a\": \"..\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: weight_map: tensor 'a': shard \"..\" is not a plain file "
                        "name in the checkpoint directory",
                        dir);
}
END_TEST

START_TEST(index_malformed)
{
    write_sharded();
    tu_write_text(dir, "model.safetensors.index.json", "{\"weight_map\": [\"a\"]}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s/model.safetensors.index.json: weight_map is missing or not an object",
                        dir);
    tu_write_text(dir, "model.safetensors.index.json", "{\"metadata\": {}}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s/model.safetensors.index.json: weight_map is missing or not an object",
                        dir);
    write_index("{}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s/model.safetensors.index.json: weight_map lists no tensors", dir);
    write_index("{\"a\\nb\": \"x\"}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: weight_map: a tensor or shard name contains a control "
                        "character",
                        dir);
    write_index("{\"a\": 3}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model.safetensors.index.json: weight_map: tensor 'a': shard is integer, not a file name",
                        dir);
    tu_write_text(dir, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"x\",}}");
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s/model.safetensors.index.json:1:26: string or '}' expected near '}'",
                        dir);
}
END_TEST

START_TEST(bad_shard_named_by_file)
{
    /* A shard with a lying header is reported by its own name (not the index). */
    write_sharded();
    tu_write_st_len(dir, "model-00002-of-00002.safetensors", 500, "{}", NULL, 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s/model-00002-of-00002.safetensors: header length 500 is larger than the file (2 bytes after "
                        "the length field)",
                        dir);
}
END_TEST

/* ---- tensor_load ------------------------------------------------------------------------------------ */

START_TEST(tensor_load_wraps_each_shard_once)
{
    write_sharded();
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    berth_backend_api api;
    berth_device_info dev;
    tu_mock_api(&api, &dev, 1, 1);

    berth_tensor t;
    const char *names[4] = {"a", "b", "c", "d"};
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 4; i++) {
            memset(&t, 0, sizeof t);
            ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, names[i], &t), BERTH_OK);
            berth_tensor_info ti = {.struct_size = sizeof ti};
            ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, names[i], &ti), BERTH_OK);
            /* Zero copy: the view points at the very bytes of the mapping. */
            ck_assert(t.buf->wrapped);
            ck_assert_int_eq(t.buf->read_only, 1);
            ck_assert_ptr_eq(t.buf->mem + t.offset, ti.data);
            ck_assert_uint_le(t.offset + ti.nbytes, t.buf->n);
            ck_assert_int_eq(t.dtype, ti.dtype);
        }
    }
    ck_assert_int_eq(tu_mock.wraps, 2); /* two shards, each wrapped once */
    ck_assert_int_eq(tu_mock.allocs, 0);

    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "b", &t), BERTH_OK);
    ck_assert_int_eq(t.ndim, 2);
    ck_assert_int_eq(t.ne[0], 3); /* ggml order: innermost first */
    ck_assert_int_eq(t.ne[1], 2);
    ck_assert_int_eq(t.ne[2], 1);
    ck_assert_int_eq(t.ne[3], 1);
    ck_assert_int_eq(t.nb[0], 2);
    ck_assert_int_eq(t.nb[1], 6);
    ck_assert_int_eq(t.nb[2], 12);
    ck_assert_int_eq(t.nb[3], 12);
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "c", &t), BERTH_OK); /* scalar -> ne {1} */
    ck_assert_int_eq(t.ndim, 1);
    ck_assert_int_eq(t.ne[0], 1);
    ck_assert_int_eq(t.nb[0], 4);
    ck_assert_int_eq(t.nb[3], 4);

    /* A second backend instance gets its own wrap of each shard. */
    berth_backend_api api2;
    berth_device_info dev2;
    tu_mock_api(&api2, &dev2, 1, 2);
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api2, "a", &t), BERTH_OK);
    ck_assert_int_eq(tu_mock.wraps, 3);

    ckpt_close(ck);
    ck_assert_int_eq(tu_mock.frees, 3);
}
END_TEST

START_TEST(tensor_load_uploads_without_wrap)
{
    write_sharded();
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    berth_backend_api api;
    berth_device_info dev;
    tu_mock_api(&api, &dev, 0, 1);

    berth_tensor t;
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "a", &t), BERTH_OK);
    ck_assert(!t.buf->wrapped);
    ck_assert_uint_eq(t.offset, 0);
    ck_assert_uint_eq(t.buf->n, 16);
    ck_assert_int_eq(memcmp(t.buf->mem, a_vals, 16), 0);
    ck_assert_int_eq(t.ne[0], 4);
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "d", &t), BERTH_OK);
    ck_assert_int_eq(memcmp(t.buf->mem, d_vals, 6), 0);
    ck_assert_int_eq(t.dtype, BERTH_DTYPE_F16);
    ck_assert_int_eq(tu_mock.streams, 1);
    ck_assert_int_eq(tu_mock.allocs, 2);
    ck_assert_int_eq(tu_mock.uploads, 2);
    ck_assert_int_eq(tu_mock.syncs, 2);
    ck_assert_int_eq(tu_mock.wraps, 0);
    ckpt_close(ck);
    ck_assert_int_eq(tu_mock.frees, 2);
    ck_assert_int_eq(tu_mock.stream_destroys, 1);
}
END_TEST

START_TEST(tensor_load_errors)
{
    write_sharded();
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    berth_backend_api api;
    berth_device_info dev;
    tu_mock_api(&api, &dev, 1, 1);
    berth_tensor t;
    memset(&t, 0x77, sizeof t);
    berth_tensor before = t;
    char want[4096];

    snprintf(want, sizeof want, "%s: no tensor 'model.embed_tokens.weight' in the checkpoint", dir);
    berth_clear_error();
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "model.embed_tokens.weight", &t), BERTH_E_NOT_FOUND);
    ck_assert_str_eq(berth_last_error(), want);

    tu_mock.fail_wrap = 1;
    snprintf(want, sizeof want,
             "%s/model-00001-of-00002.safetensors: tensor 'a': buffer_wrap_host of the mapped file failed: mock: "
             "cannot register host memory",
             dir);
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "a", &t), BERTH_E_BACKEND);
    ck_assert_str_eq(berth_last_error(), want);
    ck_assert_int_eq(memcmp(&t, &before, sizeof t), 0); /* untouched on failure */
    tu_mock.fail_wrap = 0;
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "a", &t), BERTH_OK); /* a later attempt may succeed */

    tu_mock_api(&api, &dev, 0, 2);
    tu_mock.fail_alloc = 1;
    snprintf(want, sizeof want,
             "%s/model-00001-of-00002.safetensors: tensor 'b': buffer_alloc of 12 bytes failed: mock: out of device "
             "memory",
             dir);
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "b", &t), BERTH_E_DEVICE_OOM);
    ck_assert_str_eq(berth_last_error(), want);
    ckpt_close(ck);
    ck_assert_int_eq(tu_mock.frees, tu_mock.wraps + tu_mock.allocs);
    ck_assert_int_eq(tu_mock.stream_destroys, tu_mock.streams);
}
END_TEST

START_TEST(tensor_load_rank_above_four)
{
    write_config();
    unsigned char data[2] = {0};
    tu_write_st(dir, "model.safetensors",
                "{\"w\": {\"dtype\": \"U8\", \"shape\": [1, 1, 1, 1, 2], \"data_offsets\": [0, 2]}}", data, 2);
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    berth_backend_api api;
    berth_device_info dev;
    tu_mock_api(&api, &dev, 1, 1);
    berth_tensor t;
    char want[4096];
    snprintf(want, sizeof want, "%s/model.safetensors: tensor 'w': 5 dimensions, berth tensors hold at most 4", dir);
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "w", &t), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(berth_last_error(), want);
    ckpt_close(ck);
}
END_TEST

struct load_job {
    berth_checkpoint *ck;
    const berth_backend_api *api;
    int bad;
};

static void *load_many(void *arg)
{
    struct load_job *j = arg;
    const char *names[4] = {"a", "b", "c", "d"};
    for (int r = 0; r < 50; r++) {
        for (int i = 0; i < 4; i++) {
            berth_tensor t;
            berth_tensor_info ti = {.struct_size = sizeof ti};
            if (ckpt_svc_tensor_load(NULL, j->ck, j->api, names[i], &t) != BERTH_OK ||
                ckpt_svc_tensor_find(NULL, j->ck, names[i], &ti) != BERTH_OK ||
                memcmp(t.buf->mem + t.offset, ti.data, ti.nbytes) != 0)
                j->bad++;
        }
    }
    return NULL;
}

START_TEST(tensor_load_from_several_threads)
{
    /* Host services may be called from any plugin thread: the per-backend state must be made exactly once. */
    write_sharded();
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    berth_backend_api api;
    berth_device_info dev;
    tu_mock_api(&api, &dev, _i, 1); /* loop index: 1 = wrap path, 0 = upload path */
    pthread_t th[4];
    struct load_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (struct load_job){ck, &api, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, load_many, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(jobs[i].bad, 0);
    }
    if (_i) {
        ck_assert_int_eq(tu_mock.wraps, 2);
    } else {
        ck_assert_int_eq(tu_mock.streams, 1);
        ck_assert_int_eq(tu_mock.allocs, 4 * 50 * 4);
    }
    ckpt_close(ck);
    ck_assert_int_eq(tu_mock.frees, tu_mock.wraps + tu_mock.allocs);
}
END_TEST

/* ---- fits / prefetch -------------------------------------------------------------------------------- */

START_TEST(checkpoint_too_big_for_memory)
{
    /* 9.26 GB of f32 in a sparse file: the header is real, the data costs no disk. */
    write_config();
    const char *header = "{\"w\": {\"dtype\": \"F32\", \"shape\": [2315000000], \"data_offsets\": [0, 9260000000]}}";
    tu_write_st(dir, "model.safetensors", header, NULL, 0);
    int fd = open(tu_path(dir, "model.safetensors"), O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)(8 + strlen(header) + 9260000000ull)), 0);
    close(fd);

    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    ck_assert_uint_eq(ckpt_total_bytes(ck), 9260000000ull);
    berth_clear_error();
    ck_assert_int_eq(ckpt_check_fits(ck, 4000000000ull, "cpu"), BERTH_E_NOMEM);
    char want[4096];
    snprintf(want, sizeof want, "model %s: weights need 9.26 GB but cpu has 4.00 GB available", dir);
    ck_assert_str_eq(berth_last_error(), want);
    ck_assert_int_eq(ckpt_check_fits(ck, 9260000000ull, "cpu"), BERTH_OK);
    ckpt_close(ck);
}
END_TEST

static double fracs[64];
static int n_fracs;
static void on_progress(double f, void *arg)
{
    ck_assert_ptr_eq(arg, &n_fracs);
    if (n_fracs < 64)
        fracs[n_fracs++] = f;
}

START_TEST(prefetch_reports_progress)
{
    write_sharded();
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    n_fracs = 0;
    ckpt_prefetch(ck, on_progress, &n_fracs);
    ck_assert_int_ge(n_fracs, 2); /* at least one call per shard */
    for (int i = 1; i < n_fracs; i++)
        ck_assert(fracs[i] > fracs[i - 1]);
    ck_assert(fracs[0] > 0);
    ck_assert_double_eq(fracs[n_fracs - 1], 1.0);
    ckpt_prefetch(ck, NULL, NULL);
    ckpt_close(ck);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("checkpoint_open");
    TCase *tc = tcase_create("config");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, missing_directory);
    tcase_add_test(tc, missing_config_json);
    tcase_add_test(tc, config_json_syntax_error_has_line_and_column);
    tcase_add_test(tc, no_weights);
    tcase_add_test(tc, model_type_and_dir);
    suite_add_tcase(s, tc);
    tc = tcase_create("sharded");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, sharded_checkpoint_opens);
    tcase_add_test(tc, index_wins_over_single_file);
    tcase_add_test(tc, index_names_missing_shard);
    tcase_add_test(tc, index_tensor_missing_from_shard);
    tcase_add_test(tc, shard_tensor_missing_from_index);
    tcase_add_test(tc, duplicate_tensor_across_shards);
    tcase_add_test(tc, index_path_traversal_rejected);
    tcase_add_test(tc, index_malformed);
    tcase_add_test(tc, bad_shard_named_by_file);
    suite_add_tcase(s, tc);
    tc = tcase_create("load");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, tensor_load_wraps_each_shard_once);
    tcase_add_test(tc, tensor_load_uploads_without_wrap);
    tcase_add_test(tc, tensor_load_errors);
    tcase_add_test(tc, tensor_load_rank_above_four);
    tcase_add_loop_test(tc, tensor_load_from_several_threads, 0, 2);
    tcase_add_test(tc, checkpoint_too_big_for_memory);
    tcase_add_test(tc, prefetch_reports_progress);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

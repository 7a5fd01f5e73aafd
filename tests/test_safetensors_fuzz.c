/* test_safetensors_fuzz.c — corrupt a valid safetensors file at 200 pseudo-random places (byte flips, header
 * characters swapped for JSON punctuation, truncation) and open each result. Opening must either succeed with a
 * header whose every invariant holds, or fail with a one-line message naming the file — never crash (the
 * sanitize build runs this under ASan/UBSan). Deterministic: seed from BERTH_FUZZ_SEED, default fixed. */
#include "test_checkpoint_util.h"

#include "safetensors.h"

#include <stdint.h>
#include "check_run.h"

static uint64_t rng;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Check everything st_open promises about an accepted file. */
static void check_invariants(const struct st_file *f)
{
    ck_assert_uint_eq(f->data_offset + f->data_size, f->map_size);
    uint64_t sum = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct st_tensor *t = &f->tensors[i];
        if (i > 0)
            ck_assert_int_lt(strcmp(f->tensors[i - 1].name, t->name), 0);
        ck_assert_uint_le(t->begin, t->end);
        ck_assert_uint_le(t->end, f->data_size);
        ck_assert_int_le(t->ndim, ST_MAX_DIMS);
        uint64_t n = t->elem_size;
        for (int d = 0; d < t->ndim; d++) {
            ck_assert_int_ge(t->shape[d], 0);
            n *= (uint64_t)t->shape[d];
        }
        ck_assert_uint_eq(n, t->end - t->begin);
        for (int64_t j = 0; j < i; j++) {
            const struct st_tensor *u = &f->tensors[j];
            if (t->end > t->begin && u->end > u->begin)
                ck_assert_msg(t->end <= u->begin || u->end <= t->begin, "overlap accepted");
        }
        /* Read every byte: an out-of-mapping pointer would fault here. */
        const unsigned char *p = st_tensor_data(f, t);
        for (uint64_t k = 0; k < t->end - t->begin; k++)
            sum += p[k];
    }
    (void)sum;
}

START_TEST(corrupted_files_fail_cleanly)
{
    char *dir = tu_mkdtemp();
    tu_write_text(dir, "config.json", "{\"model_type\": \"gemma4_text\"}");

    /* The valid original: several dtypes, ranks 0..3, metadata, padded header. */
    char header[1024];
    snprintf(header, sizeof header, "%s",
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,3],\"data_offsets\":[0,24]},"
             "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[24,36]},"
             "\"model.layers.0.w\":{\"dtype\":\"F16\",\"shape\":[2,1,2],\"data_offsets\":[36,44]},"
             "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[44,48]},"
             "\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[48,64]}}");
    while (strlen(header) % 8)
        strcat(header, " ");
    size_t hl = strlen(header), data_len = 64, size = 8 + hl + data_len;
    unsigned char *orig = malloc(size), *buf = malloc(size);
    for (int i = 0; i < 8; i++)
        orig[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(orig + 8, header, hl);
    for (size_t i = 0; i < data_len; i++)
        orig[8 + hl + i] = (unsigned char)(i * 37 + 11);

    /* Sanity: the original opens. */
    tu_write(dir, "model.safetensors", orig, size);
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    ck_assert_int_eq(ckpt_svc_tensor_count(NULL, ck), 5);
    ckpt_close(ck);

    const char *seed_env = getenv("BERTH_FUZZ_SEED");
    rng = seed_env ? strtoull(seed_env, NULL, 0) : 0x9E3779B97F4A7C15ull;
    if (!rng)
        rng = 1;
    const char *punct = "{}[]\",:0123456789-.eE \\";
    int accepted = 0, rejected = 0;
    char file[1024];
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    for (int iter = 0; iter < 200; iter++) {
        memcpy(buf, orig, size);
        size_t len = size;
        int kind = (int)(next_rand() % 4);
        int flips = 1 + (int)(next_rand() % 3);
        for (int k = 0; k < flips; k++) {
            if (kind == 0) { /* flip bits anywhere in length field + header */
                size_t pos = next_rand() % (8 + hl);
                buf[pos] ^= (unsigned char)(1 + next_rand() % 255);
            } else if (kind == 1) { /* flip bits anywhere */
                size_t pos = next_rand() % size;
                buf[pos] ^= (unsigned char)(1 + next_rand() % 255);
            } else if (kind == 2) { /* a header byte becomes JSON punctuation or a digit */
                size_t pos = 8 + next_rand() % hl;
                buf[pos] = (unsigned char)punct[next_rand() % strlen(punct)];
            }
        }
        if (kind == 3)
            len = next_rand() % size;
        tu_write(dir, "model.safetensors", buf, len);

        struct st_file *f = NULL;
        berth_clear_error();
        berth_status st = st_open(file, &f);
        if (st == BERTH_OK) {
            check_invariants(f);
            st_close(f);
        } else {
            const char *msg = berth_last_error();
            ck_assert_msg(strncmp(msg, file, strlen(file)) == 0, "iteration %d: message does not name the file: %s",
                          iter, msg);
            ck_assert_msg(strchr(msg, '\n') == NULL, "iteration %d: multi-line message: %s", iter, msg);
        }

        /* The checkpoint layer agrees and cleans up after itself either way. */
        ck = NULL;
        berth_status st2 = ckpt_open(dir, &ck);
        ck_assert_int_eq(st2 == BERTH_OK, st == BERTH_OK);
        if (st2 == BERTH_OK) {
            berth_tensor_info ti = {.struct_size = sizeof ti};
            for (int64_t i = 0; i < ckpt_svc_tensor_count(NULL, ck); i++) {
                berth_status s3 = ckpt_svc_tensor_at(NULL, ck, i, &ti);
                ck_assert(s3 == BERTH_OK || s3 == BERTH_E_UNSUPPORTED);
                ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, ti.name, &ti), s3);
            }
            accepted++;
        } else {
            rejected++;
        }
        ckpt_close(ck);
    }
    /* Both outcomes occur, so the test exercised the parser rather than one early exit. */
    ck_assert_int_gt(rejected, 100);
    ck_assert_int_gt(accepted, 0);
    free(orig);
    free(buf);
    tu_rmdir(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("safetensors_fuzz");
    TCase *tc = tcase_create("fuzz");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, corrupted_files_fail_cleanly);
    suite_add_tcase(s, tc);
    return check_run(s, 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_safetensors_header.c — safetensors parsing: valid files read back exactly, every lying header rejected
 * with its exact one-line message. Each test writes its own files into a fresh temporary directory. */
#include "test_checkpoint_util.h"

#include <stdint.h>
#include "check_run.h"

static char *dir;

static void setup(void)
{
    dir = tu_mkdtemp();
    tu_write_text(dir, "config.json", "{\"model_type\": \"gemma4_text\"}");
}

static void teardown(void) { tu_rmdir(dir); }

/* Write model.safetensors with this header and data_len bytes of 0xAB. */
static void write_model(const char *header, size_t data_len)
{
    unsigned char *d = malloc(data_len + 1);
    memset(d, 0xAB, data_len);
    tu_write_st(dir, "model.safetensors", header, d, data_len);
    free(d);
}

#define FILE_PATH tu_path(dir, "model.safetensors")

/* ---- valid files -------------------------------------------------------------------------------------- */

START_TEST(valid_single_file_reads_back_exactly)
{
    /* f32 [2, 2] at [0, 16), bf16 [3] at [16, 22), f16 [1, 3] at [22, 28). Header padded with spaces to a
     * multiple of 8, as writers do. */
    const float f32[4] = {1.5f, -2.25f, 3.0e-3f, 1e10f};
    const uint16_t bf16[3] = {0x3F80, 0xC020, 0x3EAB}; /* 1.0, -2.5, 0.333984375 */
    const uint16_t f16[3] = {0x3C00, 0xC100, 0x3555};  /* 1.0, -2.5, 0.333251953125 */
    unsigned char data[28];
    memcpy(data, f32, 16);
    memcpy(data + 16, bf16, 6);
    memcpy(data + 22, f16, 6);
    char header[512];
    snprintf(header, sizeof header, "%s",
             "{\"__metadata__\": {\"format\": \"pt\"},"
             " \"c.f16\": {\"dtype\": \"F16\", \"shape\": [1, 3], \"data_offsets\": [22, 28]},"
             " \"a.f32\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
             " \"b.bf16\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [16, 22]}}");
    while (strlen(header) % 8)
        strcat(header, " ");
    tu_write_st(dir, "model.safetensors", header, data, sizeof data);

    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    ck_assert_int_eq(ckpt_svc_tensor_count(NULL, ck), 3);
    ck_assert_uint_eq(ckpt_total_bytes(ck), 28);

    berth_tensor_info ti = {.struct_size = sizeof ti};
    const char *order[3] = {"a.f32", "b.bf16", "c.f16"};
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(ckpt_svc_tensor_at(NULL, ck, i, &ti), BERTH_OK);
        ck_assert_str_eq(ti.name, order[i]);
    }

    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "a.f32", &ti), BERTH_OK);
    ck_assert_int_eq(ti.dtype, BERTH_DTYPE_F32);
    ck_assert_int_eq(ti.ndim, 2);
    ck_assert_int_eq(ti.shape[0], 2);
    ck_assert_int_eq(ti.shape[1], 2);
    ck_assert_int_eq(ti.shape[2], 0);
    ck_assert_uint_eq(ti.nbytes, 16);
    for (int i = 0; i < 4; i++) {
        float v;
        memcpy(&v, (const char *)ti.data + 4 * i, 4); /* data may be unaligned: memcpy */
        ck_assert_float_eq(v, f32[i]);
    }

    const float want[3] = {1.0f, -2.5f, 0.333984375f};
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "b.bf16", &ti), BERTH_OK);
    ck_assert_int_eq(ti.dtype, BERTH_DTYPE_BF16);
    ck_assert_int_eq(ti.ndim, 1);
    ck_assert_int_eq(ti.shape[0], 3);
    ck_assert_uint_eq(ti.nbytes, 6);
    for (int i = 0; i < 3; i++) {
        uint16_t h;
        memcpy(&h, (const char *)ti.data + 2 * i, 2);
        ck_assert_float_eq(tu_bf16(h), want[i]);
    }

    const float want16[3] = {1.0f, -2.5f, 0.333251953125f};
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "c.f16", &ti), BERTH_OK);
    ck_assert_int_eq(ti.dtype, BERTH_DTYPE_F16);
    ck_assert_int_eq(ti.ndim, 2);
    ck_assert_int_eq(ti.shape[0], 1);
    ck_assert_int_eq(ti.shape[1], 3);
    for (int i = 0; i < 3; i++) {
        uint16_t h;
        memcpy(&h, (const char *)ti.data + 2 * i, 2);
        ck_assert_float_eq(tu_f16(h), want16[i]);
    }

    /* The data pointers are into the mapping, consecutive as in the file: no copies. */
    berth_tensor_info ta = {.struct_size = sizeof ta};
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "a.f32", &ta), BERTH_OK);
    ck_assert_ptr_eq((const char *)ta.data + 16, (const char *)ti.data - 6);

    berth_clear_error();
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "nope", &ti), BERTH_E_NOT_FOUND);
    char want_msg[4096];
    snprintf(want_msg, sizeof want_msg, "%s: no tensor 'nope' in the checkpoint", dir);
    ck_assert_str_eq(berth_last_error(), want_msg);
    ck_assert_int_eq(ckpt_svc_tensor_at(NULL, ck, 3, &ti), BERTH_E_NOT_FOUND);
    snprintf(want_msg, sizeof want_msg, "%s: tensor index 3 is out of range (3 tensors)", dir);
    ck_assert_str_eq(berth_last_error(), want_msg);
    ck_assert_int_eq(ckpt_svc_tensor_at(NULL, ck, -1, &ti), BERTH_E_NOT_FOUND);
    ckpt_close(ck);
}
END_TEST

START_TEST(info_writes_only_fields_that_fit)
{
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8);
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    berth_tensor_info ti;
    memset(&ti, 0x5A, sizeof ti);
    ti.struct_size = (uint32_t)BERTH_SIZE_TO(berth_tensor_info, name);
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "w", &ti), BERTH_OK);
    ck_assert_int_eq(ti.dtype, BERTH_DTYPE_F32);
    ck_assert_str_eq(ti.name, "w");
    unsigned char after[sizeof ti - BERTH_SIZE_TO(berth_tensor_info, name)];
    memset(after, 0x5A, sizeof after);
    ck_assert_int_eq(memcmp((char *)&ti + BERTH_SIZE_TO(berth_tensor_info, name), after, sizeof after), 0);
    ckpt_close(ck);
}
END_TEST

START_TEST(zero_size_and_scalar_tensors)
{
    /* Empty tensors may share an offset with anything; a scalar has shape []. */
    write_model("{\"e\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [4, 4]},"
                " \"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [4, 8]},"
                " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                8);
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    berth_tensor_info ti = {.struct_size = sizeof ti};
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "e", &ti), BERTH_OK);
    ck_assert_uint_eq(ti.nbytes, 0);
    ck_assert_int_eq(ti.ndim, 2);
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "s", &ti), BERTH_OK);
    ck_assert_uint_eq(ti.nbytes, 4);
    ck_assert_int_eq(ti.ndim, 0);
    ck_assert_uint_eq(ckpt_total_bytes(ck), 8);
    ckpt_close(ck);
}
END_TEST

START_TEST(empty_header_is_a_valid_file)
{
    write_model("{}      ", 0);
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    ck_assert_int_eq(ckpt_svc_tensor_count(NULL, ck), 0);
    ckpt_close(ck);
}
END_TEST

START_TEST(unsupported_dtype_refused_when_asked)
{
    /* F64 is a real safetensors dtype berth has no berth_dtype for: open accepts it, asking for it fails. */
    write_model("{\"d\": {\"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [0, 16]},"
                " \"w\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [16, 20]}}",
                20);
    berth_checkpoint *ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
    char want[4096];
    snprintf(want, sizeof want,
             "%s: tensor 'd': dtype F64 is not supported by berth (F32, F16, BF16, I32, I64, U8 are)", FILE_PATH);
    berth_tensor_info ti = {.struct_size = sizeof ti};
    ck_assert_int_eq(ckpt_svc_tensor_find(NULL, ck, "d", &ti), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(berth_last_error(), want);
    ck_assert_str_eq(ti.name, "d"); /* still filled, so an enumerating plugin can skip it by name */
    ck_assert_int_eq(ti.dtype, -1);
    ck_assert_uint_eq(ti.nbytes, 16);
    ck_assert_int_eq(ckpt_svc_tensor_at(NULL, ck, 0, &ti), BERTH_E_UNSUPPORTED);
    ck_assert_int_eq(ckpt_svc_tensor_at(NULL, ck, 1, &ti), BERTH_OK);
    ck_assert_str_eq(ti.name, "w");

    berth_backend_api api;
    berth_device_info dev;
    tu_mock_api(&api, &dev, 1, 1);
    berth_tensor t;
    berth_clear_error();
    ck_assert_int_eq(ckpt_svc_tensor_load(NULL, ck, &api, "d", &t), BERTH_E_UNSUPPORTED);
    ck_assert_str_eq(berth_last_error(), want);
    ckpt_close(ck);
}
END_TEST

/* ---- rejections --------------------------------------------------------------------------------------- */

START_TEST(rejects_file_shorter_than_length_field)
{
    tu_write(dir, "model.safetensors", "abc", 3);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: file is 3 bytes, too short for the 8-byte header length",
                        FILE_PATH);
}
END_TEST

START_TEST(rejects_header_length_larger_than_file)
{
    tu_write_st_len(dir, "model.safetensors", 1000, "{}", NULL, 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s: header length 1000 is larger than the file (2 bytes after the length field)", FILE_PATH);
}
END_TEST

START_TEST(rejects_header_length_above_bound)
{
    tu_write_st_len(dir, "model.safetensors", (100u << 20) + 1, "{}", NULL, 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: header length 104857601 exceeds the limit of 104857600 bytes",
                        FILE_PATH);
    /* An absurd length (top bit set) must not wrap around anywhere. */
    tu_write_st_len(dir, "model.safetensors", UINT64_MAX, "{}", NULL, 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s: header length 18446744073709551615 exceeds the limit of 104857600 bytes", FILE_PATH);
}
END_TEST

START_TEST(rejects_truncated_data)
{
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s: tensor 'w': data_offsets end 16 is past the end of the data section (8 bytes; "
                        "truncated file?)",
                        FILE_PATH);
}
END_TEST

START_TEST(rejects_shape_not_matching_byte_range)
{
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 16]}}", 24);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s: tensor 'w': shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 16] span 16",
                        FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"BF16\", \"shape\": [], \"data_offsets\": [0, 4]}}", 4);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s: tensor 'w': shape [] of BF16 needs 2 bytes but data_offsets [0, 4] span 4", FILE_PATH);
}
END_TEST

START_TEST(rejects_shape_overflow)
{
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 0]}}", 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': shape is too large (byte size overflows)", FILE_PATH);
    /* A zero dimension does not excuse absurd others: strides would still overflow. */
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [0, 4611686018427387904], \"data_offsets\": [0, 0]}}", 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': shape is too large (byte size overflows)", FILE_PATH);
}
END_TEST

START_TEST(rejects_unknown_dtype)
{
    write_model("{\"w\": {\"dtype\": \"Q4_K\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 2);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': unknown dtype \"Q4_K\"", FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"F\\n32\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 2);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': unknown dtype \"F?32\"", FILE_PATH);
    write_model("{\"w\": {\"dtype\": 4, \"shape\": [2], \"data_offsets\": [0, 2]}}", 2);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': dtype is missing or not a string", FILE_PATH);
    write_model("{\"w\": {\"shape\": [2], \"data_offsets\": [0, 2]}}", 2);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': dtype is missing or not a string", FILE_PATH);
}
END_TEST

START_TEST(rejects_overlapping_ranges)
{
    write_model("{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                " \"c\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [24, 32]},"
                " \"b\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [12, 28]}}",
                32);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensors 'a' [0, 16) and 'b' [12, 28) overlap", FILE_PATH);
    /* The same range twice. */
    write_model("{\"x\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [0, 4]},"
                " \"y\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                4);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensors 'x' [0, 4) and 'y' [0, 4) overlap", FILE_PATH);
}
END_TEST

START_TEST(rejects_bad_shape_values)
{
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': shape[0] is not a non-negative integer", FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [1, 2.5], \"data_offsets\": [0, 4]}}", 4);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': shape[1] is not a non-negative integer", FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [1, \"2\"], \"data_offsets\": [0, 4]}}", 4);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': shape[1] is not a non-negative integer", FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': shape is missing or not an array", FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': shape has 9 dimensions, at most 8 are supported",
                        FILE_PATH);
}
END_TEST

START_TEST(rejects_bad_data_offsets)
{
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': data_offsets [8, 4] end before they begin", FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 8);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s: tensor 'w': data_offsets is missing or not two non-negative integers", FILE_PATH);
    write_model("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 8);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID,
                        "%s: tensor 'w': data_offsets is missing or not two non-negative integers", FILE_PATH);
}
END_TEST

START_TEST(rejects_non_object_header)
{
    write_model("[1, 2]", 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: header is not a JSON object", FILE_PATH);
    write_model("42", 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: header is not a JSON object", FILE_PATH);
    write_model("{\"w\": [1]}", 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor 'w': header entry is not an object", FILE_PATH);
    write_model("{\"__metadata__\": \"x\"}", 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: __metadata__ is not an object", FILE_PATH);
    /* A JSON-escaped newline in a name would break the one-line message rule. */
    write_model("{\"layer\\n1\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 1);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: tensor name 'layer...' contains control character 0x0a", FILE_PATH);
}
END_TEST

START_TEST(rejects_invalid_header_json)
{
    write_model("{\"w\": {\"dtype\": }}", 0);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: header is not valid JSON: 1:17: unexpected token near '}'",
                        FILE_PATH);
    /* Duplicate tensor names inside one header. */
    write_model("{\"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
                " \"w\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}",
                2);
    TU_EXPECT_OPEN_FAIL(dir, BERTH_E_INVALID, "%s: header is not valid JSON: 1:64: duplicate object key near '\"w\"'",
                        FILE_PATH);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("safetensors_header");
    TCase *tc = tcase_create("valid");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, valid_single_file_reads_back_exactly);
    tcase_add_test(tc, info_writes_only_fields_that_fit);
    tcase_add_test(tc, zero_size_and_scalar_tensors);
    tcase_add_test(tc, empty_header_is_a_valid_file);
    tcase_add_test(tc, unsupported_dtype_refused_when_asked);
    suite_add_tcase(s, tc);
    tc = tcase_create("reject");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, rejects_file_shorter_than_length_field);
    tcase_add_test(tc, rejects_header_length_larger_than_file);
    tcase_add_test(tc, rejects_header_length_above_bound);
    tcase_add_test(tc, rejects_truncated_data);
    tcase_add_test(tc, rejects_shape_not_matching_byte_range);
    tcase_add_test(tc, rejects_shape_overflow);
    tcase_add_test(tc, rejects_unknown_dtype);
    tcase_add_test(tc, rejects_overlapping_ranges);
    tcase_add_test(tc, rejects_bad_shape_values);
    tcase_add_test(tc, rejects_bad_data_offsets);
    tcase_add_test(tc, rejects_non_object_header);
    tcase_add_test(tc, rejects_invalid_header_json);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* test_checkpoint_json.c — config.json path lookups through the checkpoint services: every JSON type, arrays
 * inside objects and objects inside arrays, and the exact messages for missing paths and type mismatches. */
#include "test_checkpoint_util.h"
#include "check_run.h"

static char *dir;
static berth_checkpoint *ck;

static const char *config_json =
    "{\n"
    "  \"model_type\": \"gemma4\",\n"
    "  \"architectures\": [\"Gemma4ForConditionalGeneration\"],\n"
    "  \"text_config\": {\n"
    "    \"hidden_size\": 2560,\n"
    "    \"rms_norm_eps\": 1e-06,\n"
    "    \"rope_theta\": 1000000,\n"
    "    \"final_logit_softcapping\": 30.0,\n"
    "    \"tie_word_embeddings\": true,\n"
    "    \"use_bidirectional_attention\": false,\n"
    "    \"sliding_window\": null,\n"
    "    \"big\": 9007199254740993,\n"
    "    \"neg\": -7,\n"
    "    \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\"],\n"
    "    \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25},\n"
    "                        \"sliding_attention\": {\"rope_theta\": 10000.0}},\n"
    "    \"nested\": [[1, 2], [3, {\"k\": \"v\"}]],\n"
    "    \"name\": \"text\"\n"
    "  },\n"
    "  \"vision_config\": null,\n"
    "  \"empty_obj\": {},\n"
    "  \"empty_arr\": []\n"
    "}\n";

static void setup(void)
{
    dir = tu_mkdtemp();
    tu_write_text(dir, "config.json", config_json);
    tu_write_st(dir, "model.safetensors", "{}      ", NULL, 0);
    ck = NULL;
    ck_assert_int_eq(ckpt_open(dir, &ck), BERTH_OK);
}

static void teardown(void)
{
    ckpt_close(ck);
    tu_rmdir(dir);
}

/* Expect status code and exactly message msg. */
#define EXPECT_ERR(call, code, msg)                                                                              \
    do {                                                                                                         \
        berth_clear_error();                                                                                     \
        ck_assert_int_eq((call), (code));                                                                        \
        ck_assert_str_eq(berth_last_error(), (msg));                                                             \
    } while (0)

START_TEST(types_of_every_kind)
{
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, ""), BERTH_JSON_OBJECT);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "model_type"), BERTH_JSON_STRING);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "architectures"), BERTH_JSON_ARRAY);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config"), BERTH_JSON_OBJECT);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.hidden_size"), BERTH_JSON_INT);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.rms_norm_eps"), BERTH_JSON_REAL);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.tie_word_embeddings"), BERTH_JSON_BOOL);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.use_bidirectional_attention"), BERTH_JSON_BOOL);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.sliding_window"), BERTH_JSON_NULL);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "vision_config"), BERTH_JSON_NULL);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.layer_types.2"), BERTH_JSON_STRING);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.nested.1.1"), BERTH_JSON_OBJECT);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.missing"), BERTH_JSON_MISSING);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "text_config.layer_types.3"), BERTH_JSON_MISSING);
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "vision_config.hidden_size"), BERTH_JSON_MISSING);
    /* A type query is not an error: the previous message survives it. */
    berth_fail(BERTH_E_INVALID, "earlier");
    ck_assert_int_eq(ckpt_svc_cfg_type(NULL, ck, "nope.nope"), BERTH_JSON_MISSING);
    ck_assert_str_eq(berth_last_error(), "earlier");
}
END_TEST

START_TEST(typed_values)
{
    int64_t i = 0;
    double r = 0;
    int32_t b = -1;
    const char *s = NULL;
    ck_assert_int_eq(ckpt_svc_cfg_int(NULL, ck, "text_config.hidden_size", &i), BERTH_OK);
    ck_assert_int_eq(i, 2560);
    ck_assert_int_eq(ckpt_svc_cfg_int(NULL, ck, "text_config.big", &i), BERTH_OK);
    ck_assert_int_eq(i, 9007199254740993LL); /* beyond double precision: read as an integer, exactly */
    ck_assert_int_eq(ckpt_svc_cfg_int(NULL, ck, "text_config.neg", &i), BERTH_OK);
    ck_assert_int_eq(i, -7);
    ck_assert_int_eq(ckpt_svc_cfg_real(NULL, ck, "text_config.rms_norm_eps", &r), BERTH_OK);
    ck_assert_double_eq(r, 1e-06);
    ck_assert_int_eq(ckpt_svc_cfg_real(NULL, ck, "text_config.rope_theta", &r), BERTH_OK); /* integer accepted */
    ck_assert_double_eq(r, 1000000.0);
    ck_assert_int_eq(ckpt_svc_cfg_real(NULL, ck, "text_config.rope_parameters.full_attention.partial_rotary_factor",
                                       &r),
                     BERTH_OK);
    ck_assert_double_eq(r, 0.25);
    ck_assert_int_eq(ckpt_svc_cfg_bool(NULL, ck, "text_config.tie_word_embeddings", &b), BERTH_OK);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(ckpt_svc_cfg_bool(NULL, ck, "text_config.use_bidirectional_attention", &b), BERTH_OK);
    ck_assert_int_eq(b, 0);
    ck_assert_int_eq(ckpt_svc_cfg_string(NULL, ck, "model_type", &s), BERTH_OK);
    ck_assert_str_eq(s, "gemma4");
    ck_assert_str_eq(ckpt_model_type(ck), "gemma4");
    ck_assert_int_eq(ckpt_svc_cfg_string(NULL, ck, "text_config.layer_types.2", &s), BERTH_OK);
    ck_assert_str_eq(s, "full_attention");
    ck_assert_int_eq(ckpt_svc_cfg_string(NULL, ck, "architectures.0", &s), BERTH_OK);
    ck_assert_str_eq(s, "Gemma4ForConditionalGeneration");
    ck_assert_int_eq(ckpt_svc_cfg_string(NULL, ck, "text_config.nested.1.1.k", &s), BERTH_OK);
    ck_assert_str_eq(s, "v");
    ck_assert_int_eq(ckpt_svc_cfg_int(NULL, ck, "text_config.nested.1.0", &i), BERTH_OK);
    ck_assert_int_eq(i, 3);
}
END_TEST

START_TEST(lengths_and_keys)
{
    int64_t n = -1;
    const char *k = NULL;
    ck_assert_int_eq(ckpt_svc_cfg_len(NULL, ck, "text_config.layer_types", &n), BERTH_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(ckpt_svc_cfg_len(NULL, ck, "text_config.rope_parameters", &n), BERTH_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ckpt_svc_cfg_len(NULL, ck, "", &n), BERTH_OK);
    ck_assert_int_eq(n, 6);
    ck_assert_int_eq(ckpt_svc_cfg_len(NULL, ck, "empty_arr", &n), BERTH_OK);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(ckpt_svc_cfg_len(NULL, ck, "empty_obj", &n), BERTH_OK);
    ck_assert_int_eq(n, 0);
    /* Keys in file order, not sorted. */
    const char *top[6] = {"model_type", "architectures", "text_config", "vision_config", "empty_obj", "empty_arr"};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(ckpt_svc_cfg_key(NULL, ck, "", i, &k), BERTH_OK);
        ck_assert_str_eq(k, top[i]);
    }
    ck_assert_int_eq(ckpt_svc_cfg_key(NULL, ck, "text_config.rope_parameters", 1, &k), BERTH_OK);
    ck_assert_str_eq(k, "sliding_attention");
    ck_assert_int_eq(ckpt_svc_cfg_key(NULL, ck, "text_config", 12, &k), BERTH_OK);
    ck_assert_str_eq(k, "name");
}
END_TEST

START_TEST(type_mismatch_messages)
{
    int64_t i;
    double r;
    int32_t b;
    const char *s;
    EXPECT_ERR(ckpt_svc_cfg_int(NULL, ck, "text_config.name", &i), BERTH_E_INVALID,
               "config.json: text_config.name: expected an integer, got string");
    EXPECT_ERR(ckpt_svc_cfg_int(NULL, ck, "text_config.rms_norm_eps", &i), BERTH_E_INVALID,
               "config.json: text_config.rms_norm_eps: expected an integer, got real");
    EXPECT_ERR(ckpt_svc_cfg_real(NULL, ck, "model_type", &r), BERTH_E_INVALID,
               "config.json: model_type: expected a number, got string");
    EXPECT_ERR(ckpt_svc_cfg_real(NULL, ck, "text_config.tie_word_embeddings", &r), BERTH_E_INVALID,
               "config.json: text_config.tie_word_embeddings: expected a number, got boolean");
    EXPECT_ERR(ckpt_svc_cfg_bool(NULL, ck, "text_config.nested.0.0", &b), BERTH_E_INVALID,
               "config.json: text_config.nested.0.0: expected true or false, got integer");
    EXPECT_ERR(ckpt_svc_cfg_string(NULL, ck, "vision_config", &s), BERTH_E_INVALID,
               "config.json: vision_config: expected a string, got null");
    EXPECT_ERR(ckpt_svc_cfg_string(NULL, ck, "", &s), BERTH_E_INVALID,
               "config.json: (top level): expected a string, got object");
    EXPECT_ERR(ckpt_svc_cfg_len(NULL, ck, "text_config.hidden_size", &i), BERTH_E_INVALID,
               "config.json: text_config.hidden_size: expected an array or object, got integer");
    EXPECT_ERR(ckpt_svc_cfg_key(NULL, ck, "architectures", 0, &s), BERTH_E_INVALID,
               "config.json: architectures: expected an object, got array");
}
END_TEST

START_TEST(missing_path_messages)
{
    int64_t i;
    const char *s;
    EXPECT_ERR(ckpt_svc_cfg_int(NULL, ck, "hidden_size", &i), BERTH_E_NOT_FOUND,
               "config.json: hidden_size: no key \"hidden_size\" at the top level");
    EXPECT_ERR(ckpt_svc_cfg_int(NULL, ck, "text_config.num_layers", &i), BERTH_E_NOT_FOUND,
               "config.json: text_config.num_layers: no key \"num_layers\" in text_config");
    EXPECT_ERR(ckpt_svc_cfg_real(NULL, ck, "text_config.rope_parameters.full.x", (double *)&i), BERTH_E_NOT_FOUND,
               "config.json: text_config.rope_parameters.full.x: no key \"full\" in text_config.rope_parameters");
    EXPECT_ERR(ckpt_svc_cfg_string(NULL, ck, "text_config.layer_types.3", &s), BERTH_E_NOT_FOUND,
               "config.json: text_config.layer_types.3: index 3 is out of range (text_config.layer_types has 3 "
               "elements)");
    EXPECT_ERR(ckpt_svc_cfg_string(NULL, ck, "text_config.layer_types.first", &s), BERTH_E_NOT_FOUND,
               "config.json: text_config.layer_types.first: \"first\" is not an index into the array "
               "text_config.layer_types");
    EXPECT_ERR(ckpt_svc_cfg_string(NULL, ck, "architectures.-1", &s), BERTH_E_NOT_FOUND,
               "config.json: architectures.-1: \"-1\" is not an index into the array architectures");
    EXPECT_ERR(ckpt_svc_cfg_int(NULL, ck, "text_config.hidden_size.x", &i), BERTH_E_NOT_FOUND,
               "config.json: text_config.hidden_size.x: text_config.hidden_size is integer, not an object or array");
    EXPECT_ERR(ckpt_svc_cfg_int(NULL, ck, "vision_config.hidden_size", &i), BERTH_E_NOT_FOUND,
               "config.json: vision_config.hidden_size: vision_config is null, not an object or array");
    EXPECT_ERR(ckpt_svc_cfg_key(NULL, ck, "text_config.rope_parameters", 2, &s), BERTH_E_NOT_FOUND,
               "config.json: text_config.rope_parameters: member index 2 is out of range (the object has 2 members)");
    EXPECT_ERR(ckpt_svc_cfg_key(NULL, ck, "", -1, &s), BERTH_E_NOT_FOUND,
               "config.json: (top level): member index -1 is out of range (the object has 6 members)");
    EXPECT_ERR(ckpt_svc_cfg_len(NULL, ck, "text_config.", &i), BERTH_E_NOT_FOUND,
               "config.json: text_config.: no key \"\" in text_config");
}
END_TEST

START_TEST(outputs_untouched_on_error)
{
    int64_t i = 42;
    double r = 4.5;
    int32_t b = 7;
    const char *s = "keep";
    ck_assert_int_ne(ckpt_svc_cfg_int(NULL, ck, "model_type", &i), BERTH_OK);
    ck_assert_int_ne(ckpt_svc_cfg_real(NULL, ck, "nope", &r), BERTH_OK);
    ck_assert_int_ne(ckpt_svc_cfg_bool(NULL, ck, "text_config.hidden_size", &b), BERTH_OK);
    ck_assert_int_ne(ckpt_svc_cfg_string(NULL, ck, "text_config.hidden_size", &s), BERTH_OK);
    ck_assert_int_eq(i, 42);
    ck_assert_double_eq(r, 4.5);
    ck_assert_int_eq(b, 7);
    ck_assert_str_eq(s, "keep");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("checkpoint_json");
    TCase *tc = tcase_create("paths");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, types_of_every_kind);
    tcase_add_test(tc, typed_values);
    tcase_add_test(tc, lengths_and_keys);
    tcase_add_test(tc, type_mismatch_messages);
    tcase_add_test(tc, missing_path_messages);
    tcase_add_test(tc, outputs_untouched_on_error);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

/*
 * test_cuda_env_switch.c — the value rules of the CUDA backend's environment switches (plugins/backend-cuda/
 * env_switch.h), which cuda_backend.cu applies to every BERTH_CUDA_* integer and named switch at init. No GPU.
 */
#include "env_switch.h"

#include <check.h>
#include <stdlib.h>
#include "check_run.h"

START_TEST(test_int_accepts_digits_in_range)
{
    int v = -1;
    ck_assert_int_eq(cu_env_parse_int("0", 0, 8, 1, &v), 1);
    ck_assert_int_eq(v, 0);
    ck_assert_int_eq(cu_env_parse_int("8", 0, 8, 1, &v), 1);
    ck_assert_int_eq(v, 8);
    ck_assert_int_eq(cu_env_parse_int("03", 0, 8, 1, &v), 1); /* leading zeros are digits */
    ck_assert_int_eq(v, 3);
    ck_assert_int_eq(cu_env_parse_int("4096", 16, 4096, 16, &v), 1);
    ck_assert_int_eq(v, 4096);
    ck_assert_int_eq(cu_env_parse_int("32", 16, 4096, 16, &v), 1);
    ck_assert_int_eq(v, 32);
}
END_TEST

START_TEST(test_int_rejects_and_keeps_out)
{
    static const char *bad[] = {"",   "+3", " 3", "3 ", "-1", "3x", "x3", "9",
                                "10", "1e1", "0x2", "99999999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int v = 42;
        ck_assert_msg(cu_env_parse_int(bad[i], 0, 8, 1, &v) == 0, "'%s' was accepted for 0..8", bad[i]);
        ck_assert_int_eq(v, 42);
    }
    int v = 42;
    ck_assert_int_eq(cu_env_parse_int("24", 16, 4096, 16, &v), 0); /* not a multiple of the step */
    ck_assert_int_eq(cu_env_parse_int("0", 16, 4096, 16, &v), 0);  /* below lo */
    ck_assert_int_eq(cu_env_parse_int("1", 2, 64, 1, &v), 0);
    ck_assert_int_eq(cu_env_parse_int(NULL, 0, 8, 1, &v), 0);
    ck_assert_int_eq(cu_env_parse_int("4", 0, 8, 0, &v), 0);     /* a step below 1 */
    ck_assert_int_eq(cu_env_parse_int("4", 8, 0, 1, &v), 0);     /* lo > hi */
    ck_assert_int_eq(cu_env_parse_int("2147483647", 0, 2147483647, 1, &v), 1); /* INT_MAX itself, no overflow */
    ck_assert_int_eq(v, 2147483647);
    v = 42;
    ck_assert_int_eq(cu_env_parse_int("2147483648", 0, 2147483647, 1, &v), 0);
    ck_assert_int_eq(v, 42);
}
END_TEST

START_TEST(test_choice)
{
    static const struct cu_env_name names[] = {{"auto", 4}, {"mma", 3}, {"64", 64}, {"0", 0}};
    int v = -1;
    ck_assert_int_eq(cu_env_parse_choice("mma", names, 4, &v), 1);
    ck_assert_int_eq(v, 3);
    ck_assert_int_eq(cu_env_parse_choice("64", names, 4, &v), 1);
    ck_assert_int_eq(v, 64);
    ck_assert_int_eq(cu_env_parse_choice("0", names, 4, &v), 1);
    ck_assert_int_eq(v, 0);
    v = -1;
    static const char *bad[] = {"", "AUTO", "auto ", "mm", "064", "8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(cu_env_parse_choice(bad[i], names, 4, &v) == 0, "'%s' was accepted", bad[i]);
        ck_assert_int_eq(v, -1);
    }
    ck_assert_int_eq(cu_env_parse_choice(NULL, names, 4, &v), 0);
}
END_TEST

static Suite *make_suite(void)
{
    Suite *s = suite_create("cuda_env_switch");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_int_accepts_digits_in_range);
    tcase_add_test(tc, test_int_rejects_and_keeps_out);
    tcase_add_test(tc, test_choice);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return check_run(make_suite(), 0) ? EXIT_FAILURE : EXIT_SUCCESS;
}

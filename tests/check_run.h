/*
 * check_run.h — how the test programs in tests/ run their check suite: every test, normal output, and the number of
 * tests that failed back to main (which exits EXIT_FAILURE when it is not 0, as meson reads it). nofork: run the
 * tests in this process whatever CK_FORK says (CUDA must not cross a fork; some suites keep state between tests);
 * 0 leaves check's default (fork per test unless CK_FORK=no).
 */
#ifndef BERTH_TEST_CHECK_RUN_H
#define BERTH_TEST_CHECK_RUN_H

#include <check.h>

/* Runs s (which it frees); the number of failed tests. */
static inline int check_run(Suite *s, int nofork)
{
    SRunner *sr = srunner_create(s);
    if (nofork)
        srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

#endif

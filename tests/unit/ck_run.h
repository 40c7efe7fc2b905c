/* tests/unit/ck_run.h: the end of every Check suite's main(), in one place. */
#ifndef DEAR_TESTS_CK_RUN_H
#define DEAR_TESTS_CK_RUN_H

#include <check.h>

/* Run every test of s, print Check's summary, and give automake's exit status (0 or 1). */
static inline int dear_ck_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif

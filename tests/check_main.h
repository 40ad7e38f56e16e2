/* The end of every suite's main(). */
#ifndef GPUBUF_CHECK_MAIN_H
#define GPUBUF_CHECK_MAIN_H

#include <check.h>

/* Run suite s (Check's fork mode and timeouts come from the environment
 * ctest sets); 0 when every test passed. */
static inline int run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

#endif

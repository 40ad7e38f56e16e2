/* The end of every suite's main(). */
#ifndef GPUBUF_CHECK_MAIN_H
#define GPUBUF_CHECK_MAIN_H

#include <check.h>

/* A test case named name, added to s, with the checked fixture setup and
 * teardown (NULL: none) and a timeout in seconds (0: Check's default, which
 * ctest sets); add its tests to what it returns. */
static inline TCase *add_case(Suite *s, const char *name, SFun setup, SFun teardown,
                              double timeout) {
    TCase *t = tcase_create(name);
    if (setup || teardown)
        tcase_add_checked_fixture(t, setup, teardown);
    if (timeout > 0)
        tcase_set_timeout(t, timeout);
    suite_add_tcase(s, t);
    return t;
}

/* Add the tests (the names START_TEST defines) to test case t, in order. */
#define add_tests(t, ...) add_tests_((t), (const TTest *const[]){__VA_ARGS__, NULL})
static inline void add_tests_(TCase *t, const TTest *const *tests) {
    for (; *tests; tests++)
        tcase_add_test(t, *tests);
}

/* Run suite s (Check's fork mode and timeouts come from the environment
 * ctest sets); 0 when every test passed. */
static inline int run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}

/* The main() of a suite of one test case: SUITE_MAIN("suite", "case", setup,
 * teardown, timeout, test, ...) (add_case's arguments, then the tests). */
#define SUITE_MAIN(suite, tcase, setup, teardown, timeout, ...)                                 \
    int main(void) {                                                                           \
        Suite *s_ = suite_create(suite);                                                       \
        add_tests(add_case(s_, tcase, setup, teardown, timeout), __VA_ARGS__);                 \
        return run_suite(s_);                                                                  \
    }

#endif


/* CUDA discovery: on a machine with a GPU the build must see it; elsewhere the test skips
 * (exit 77), and a build without CUDA must say DEAR_ERR_UNSUPPORTED rather than pretend. */
#include <check.h>
#include <stdlib.h>

#include "cuda/cuda.h"
#include "include/dear.h"

START_TEST(test_build_without_cuda_reports_unsupported)
{
    int n = -1;
    ck_assert_int_eq(dear_cuda_device_count(&n), DEAR_ERR_UNSUPPORTED);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(dear_nccl_built(), 0);
}
END_TEST

START_TEST(test_gpu_visible)
{
    int n = 0;
    ck_assert_int_eq(dear_cuda_device_count(&n), DEAR_OK);
    ck_assert_int_gt(n, 0);
}
END_TEST

int main(void)
{
    int n = 0;
    if (dear_cuda_built() && (dear_cuda_device_count(&n) != DEAR_OK || n == 0))
        return 77; /* built with CUDA, but no GPU here (before the suite exists: nothing leaks) */
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("device");
    if (!dear_cuda_built())
        tcase_add_test(tc, test_build_without_cuda_reports_unsupported);
    else
        tcase_add_test(tc, test_gpu_visible);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

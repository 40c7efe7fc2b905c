/* Statistics of timings (base/stats.c): the median, and dear_samples_compare, the judgement of
 * auto's check, against hand computations: a difference beyond the margin decides, one within it
 * is inconclusive, one stall moves neither the medians nor the spread, and the relative floor
 * holds when the samples show no spread at all; dear_check_verdict, the plan auto keeps, and
 * dear_tie_verdict, the one it keeps between plans the model predicts alike; and
 * dear_stream_median, calibration's time per collective of a stream that a stall does not move. */
#include <check.h>
#include <math.h>

#include "base/stats.h"
#include "tests/unit/ck_run.h"

START_TEST(test_median)
{
    double v[] = { 5, 1, 4, 2, 3 };
    ck_assert(dear_median(v, 5) == 3);
    ck_assert(dear_median(v, 4) == 3); /* 5 1 4 2: (2 + 4) / 2 */
    ck_assert(v[0] == 5 && v[4] == 3); /* left as it was */
    ck_assert(dear_median(v, 0) == 0);
}
END_TEST

START_TEST(test_stream_median)
{
    /* Back to back from t0 = 1: 0.1 each, one stall of 0.3 in the third: the median is 0.1,
     * where the stream's mean would be 0.16. */
    double done[] = { 1.1, 1.2, 1.6, 1.7, 1.8 };
    ck_assert(fabs(dear_stream_median(done, 5, 1, 1.0) - 0.1) < 1e-12);
    ck_assert(fabs((done[4] - 1.0) / 5 - 0.16) < 1e-12);
    /* Two in flight, completions in pairs 0.2 apart: windows of two give 0.1 per item, where the
     * gaps between single completions (0 or 0.2) would not. */
    double pairs[] = { 0.2, 0.2, 0.4, 0.4, 0.6, 0.6, 0.8, 0.8 };
    ck_assert(fabs(dear_stream_median(pairs, 8, 2, 0.0) - 0.1) < 1e-12);
    /* Two windows of 0.1 and 0.5 per item: the median of an even count is their mean */
    double two[] = { 0.1, 0.6 };
    ck_assert(fabs(dear_stream_median(two, 2, 1, 0.0) - 0.3) < 1e-12);
    ck_assert(dear_stream_median(done, 1, 2, 1.0) == 0); /* fewer completions than in flight */
    ck_assert(dear_stream_median(done, 5, 0, 1.0) == 0);
}
END_TEST

START_TEST(test_compare)
{
    dear_compare_t c;
    /* a: median 10, deviations 1 0 1 0; b: median 20, deviations 1 0 1 0; pooled MAD 0.5 */
    double a[] = { 9, 10, 11, 10 }, b[] = { 19, 20, 21, 20 };
    ck_assert_int_eq(dear_samples_compare(a, 4, b, 4, 2, 0.02, &c), -1);
    ck_assert(c.med_a == 10 && c.med_b == 20);
    ck_assert(fabs(c.spread - 1.4826 * 0.5) < 1e-12);
    ck_assert(fabs(c.margin - 2 * 1.4826 * 0.5) < 1e-12);
    ck_assert_int_eq(dear_samples_compare(b, 4, a, 4, 2, 0.02, &c), 1);
    /* 10 apart against a margin of 20 spreads (14.8): inconclusive either way */
    ck_assert_int_eq(dear_samples_compare(a, 4, b, 4, 20, 0.02, &c), 0);
    ck_assert_int_eq(dear_samples_compare(b, 4, a, 4, 20, 0.02, &c), 0);
}
END_TEST

START_TEST(test_compare_noise)
{
    dear_compare_t c;
    /* b is 1 faster, the samples spread by about 4: inconclusive; a stall of 1000 in b changes
     * neither its median (one sample of five) nor the spread enough to decide */
    double a[] = { 10, 14, 6, 12, 8 }, b[] = { 9, 13, 5, 11, 7 };
    ck_assert_int_eq(dear_samples_compare(a, 5, b, 5, 2, 0.02, &c), 0);
    double spread = c.spread;
    ck_assert(spread > 2 && spread < 5);
    double b_stall[] = { 9, 13, 1000, 11, 7 };
    ck_assert_int_eq(dear_samples_compare(a, 5, b_stall, 5, 2, 0.02, &c), 0);
    ck_assert(c.med_b == 11);
    ck_assert(c.spread < 2 * spread);
    /* unequal counts */
    double a3[] = { 10, 10.5, 9.5 };
    ck_assert_int_eq(dear_samples_compare(a3, 3, b, 5, 2, 0.02, &c), 0);
}
END_TEST

START_TEST(test_compare_floor)
{
    dear_compare_t c;
    /* no spread at all: the floor of 2% of the faster median decides */
    double a[] = { 100, 100, 100 }, b1[] = { 101.5, 101.5, 101.5 }, b3[] = { 103, 103, 103 };
    ck_assert_int_eq(dear_samples_compare(a, 3, b1, 3, 2, 0.02, &c), 0);
    ck_assert(c.spread == 0 && fabs(c.margin - 2) < 1e-12);
    ck_assert_int_eq(dear_samples_compare(a, 3, b3, 3, 2, 0.02, &c), -1);
    ck_assert_int_eq(dear_samples_compare(b3, 3, a, 3, 2, 0.02, &c), 1);
}
END_TEST

START_TEST(test_verdict)
{
    dear_verdict_t why;
    /* beyond the margin the measurement decides, whatever the model said */
    dear_compare_t c = { 100, 80, 5, 10 };
    ck_assert_int_eq(dear_check_verdict(1, &c, 100, 120, &why), 1);
    ck_assert_int_eq(why, DEAR_VERDICT_MEASURED);
    dear_compare_t c_old = { 80, 100, 5, 10 };
    ck_assert_int_eq(dear_check_verdict(-1, &c_old, 120, 100, &why), 0);
    ck_assert_int_eq(why, DEAR_VERDICT_MEASURED);
    /* inconclusive (2 apart, margin 10); the model predicted 5 apart, 3 from the measured: it decides */
    dear_compare_t in = { 100, 98, 5, 10 };
    ck_assert_int_eq(dear_check_verdict(0, &in, 105, 100, &why), 1);
    ck_assert_int_eq(why, DEAR_VERDICT_MODEL);
    ck_assert_int_eq(dear_check_verdict(0, &in, 100, 105, &why), 0); /* it predicted the old faster */
    ck_assert_int_eq(why, DEAR_VERDICT_MODEL);
    ck_assert_int_eq(dear_check_verdict(0, &in, 100, 100, &why), 1); /* a tie: the fresher plan */
    ck_assert_int_eq(dear_check_verdict(0, &in, 100, INFINITY, &why), 0); /* a failed prediction loses */
    ck_assert_int_eq(why, DEAR_VERDICT_MODEL);
    /* the model promised the new plan 291.8 ms faster; it ran 69.1 ms slower, inside a margin of
     * 134.2 ms but 360.9 ms from the promise: refuted, and the old plan, measured faster, stays */
    dear_compare_t torch = { 1269.8, 1338.9, 67.1, 134.2 };
    ck_assert_int_eq(dear_check_verdict(0, &torch, 1268.6, 976.8, &why), 0);
    ck_assert_int_eq(why, DEAR_VERDICT_REFUTED);
    /* refuted the other way: the model promised 110, the new plan gained 10 (margin 15): the
     * measured faster is still the new one */
    dear_compare_t small = { 200, 190, 7, 15 };
    ck_assert_int_eq(dear_check_verdict(0, &small, 300, 190, &why), 1);
    ck_assert_int_eq(why, DEAR_VERDICT_REFUTED);
    /* no samples (no spread, no margin): only the model is left */
    dear_compare_t none = { NAN, NAN, NAN, NAN };
    ck_assert_int_eq(dear_check_verdict(0, &none, 300, 190, &why), 1);
    ck_assert_int_eq(why, DEAR_VERDICT_MODEL);
}
END_TEST

START_TEST(test_tie_verdict)
{
    dear_verdict_t why = DEAR_VERDICT_MODEL;
    /* beyond the margin the measurement decides, as for any check */
    dear_compare_t c = { 100, 80, 5, 10 }, c_old = { 80, 100, 5, 10 };
    ck_assert_int_eq(dear_tie_verdict(1, &c, &why), 1);
    ck_assert_int_eq(why, DEAR_VERDICT_MEASURED);
    ck_assert_int_eq(dear_tie_verdict(-1, &c_old, &why), 0);
    ck_assert_int_eq(why, DEAR_VERDICT_MEASURED);
    /* within it, the lower median: 1.5 apart under a margin of 6, either way */
    dear_compare_t newer = { 300, 298.5, 2, 6 }, older = { 298.5, 300, 2, 6 };
    ck_assert_int_eq(dear_tie_verdict(0, &newer, &why), 1);
    ck_assert_int_eq(why, DEAR_VERDICT_TIE);
    ck_assert_int_eq(dear_tie_verdict(0, &older, &why), 0);
    ck_assert_int_eq(why, DEAR_VERDICT_TIE);
    /* equal medians, or none: the plan in force before the check stays */
    dear_compare_t same = { 300, 300, 2, 6 }, none = { NAN, NAN, NAN, NAN };
    ck_assert_int_eq(dear_tie_verdict(0, &same, &why), 0);
    ck_assert_int_eq(dear_tie_verdict(0, &none, &why), 0);
    ck_assert_int_eq(why, DEAR_VERDICT_TIE);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("stats");
    tcase_add_test(tc, test_median);
    tcase_add_test(tc, test_stream_median);
    tcase_add_test(tc, test_compare);
    tcase_add_test(tc, test_compare_noise);
    tcase_add_test(tc, test_compare_floor);
    tcase_add_test(tc, test_verdict);
    tcase_add_test(tc, test_tie_verdict);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}

/*
 * The exact sum (base/xsum.h), checked against values computed another way:
 *   - totals known exactly (cancellation, the smallest subnormal, values near the largest
 *     double) come out exact, where a float64 loop loses them;
 *   - the squares of 100000 random float32 values, added in three orders and in 7 groups whose
 *     exported words are then added element-wise, give one value bit for bit, within one
 *     rounding of a long double reference;
 *   - Inf and NaN make the total non-finite.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/xsum.h"
#include "tests/unit/ck_run.h"

static double total(const double *v, size_t n)
{
    dear_xsum_t x;
    double w[DEAR_XSUM_WORDS];
    dear_xsum_init(&x);
    for (size_t i = 0; i < n; i++)
        dear_xsum_add(&x, v[i]);
    dear_xsum_export(&x, w);
    return dear_xsum_value(w);
}

START_TEST(test_exact)
{
    const double cancel[] = { 1e100, 1.0, -1e100, 0x1p-60 };
    ck_assert(total(cancel, 4) == 1.0 + 0x1p-60); /* a float64 loop gives 0x1p-60 */
    const double tiny[] = { 0x1p-1074, 0x1p-1074, 0x1p-1074 };
    ck_assert(total(tiny, 3) == 3 * 0x1p-1074);
    const double big[] = { 0x1p1023, -0x1p1023, DBL_MAX, 0.5 };
    ck_assert(total(big, 4) == DBL_MAX);
    /* 10^6 times 0.1 (a double just above 1/10): exactly 10^6 of it, rounded once. */
    dear_xsum_t x;
    double w[DEAR_XSUM_WORDS];
    dear_xsum_init(&x);
    for (int i = 0; i < 1000000; i++)
        dear_xsum_add(&x, 0.1);
    dear_xsum_export(&x, w);
    ck_assert(dear_xsum_value(w) == (double)(1000000 * (long double)0.1));
}
END_TEST

static uint64_t rng = 88172645463325252ULL;
static double next_square(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    /* float32 values over many binades, as gradients are */
    float f = (float)ldexp((double)(rng >> 40) / (double)(1 << 24), (int)(rng % 40) - 30);
    return (double)f * (double)f;     /* exact: 24-bit mantissas */
}

START_TEST(test_order_and_groups)
{
    enum { N = 100000, G = 7 };
    double *v = malloc(N * sizeof *v);
    ck_assert_ptr_nonnull(v);
    long double ref = 0;
    for (int i = 0; i < N; i++) {
        v[i] = next_square();
        ref += v[i];
    }
    double fwd = total(v, N);
    for (int i = 0; i < N / 2; i++) { /* reversed */
        double t = v[i];
        v[i] = v[N - 1 - i];
        v[N - 1 - i] = t;
    }
    ck_assert(total(v, N) == fwd);
    for (int i = N - 1; i > 0; i--) { /* shuffled */
        size_t j = (size_t)((rng = rng * 6364136223846793005ULL + 1) >> 33) % (size_t)(i + 1);
        double t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
    ck_assert(total(v, N) == fwd);
    /* G uneven groups, each exported, the words added element-wise as an all-reduce would */
    double sum[DEAR_XSUM_WORDS] = { 0 };
    for (int g = 0, lo = 0; g < G; g++) {
        int hi = g == G - 1 ? N : lo + (g + 1) * N / 40;
        dear_xsum_t x;
        double w[DEAR_XSUM_WORDS];
        dear_xsum_init(&x);
        for (int i = lo; i < hi; i++)
            dear_xsum_add(&x, v[i]);
        dear_xsum_export(&x, w);
        for (int k = 0; k < DEAR_XSUM_WORDS; k++)
            sum[k] += w[k];
        lo = hi;
    }
    ck_assert(dear_xsum_value(sum) == fwd);
    ck_assert_msg(fabsl((long double)fwd - ref) <= ref * 0x1p-52, "exact sum %.17g, long double %.17Lg", fwd, ref);
    free(v);
}
END_TEST

START_TEST(test_special)
{
    const double inf[] = { 1.0, INFINITY, 2.0 };
    ck_assert(isinf(total(inf, 3)));
    const double nan[] = { 1.0, NAN, INFINITY };
    ck_assert(isnan(total(nan, 3)));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("xsum");
    TCase *tc = tcase_create("xsum");
    tcase_add_test(tc, test_exact);
    tcase_add_test(tc, test_order_and_groups);
    tcase_add_test(tc, test_special);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}

/*
 * The int8 block codec (collectives/elem.h, reduce.c's dear_reduce_q8_pack/unpack), checked
 * against a float64 reference computed here:
 *   - every block's scale is max|x| / 127 (float64, to float32 rounding), its largest element
 *     codes to +-127, and every value lies within scale / 2 of its input (float32 rounding aside);
 *   - block boundaries at every multiple of DEAR_Q8_BLOCK, a ragged last block, n = 0 and 1;
 *   - a zero block has scale 0 and values 0; a block holding NaN or an infinity arrives all NaN
 *     and leaves its neighbours as they are; the bytes are dear_q8_bytes(n);
 *   - error feedback: value + residual gives back the input, and over iterations of the same
 *     input the values' sum stays within one scale of the inputs' sum (the error does not grow);
 *   - unpack accumulates in float32.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/elem.h"
#include "collectives/reduce.h"
#include "tests/unit/ck_run.h"

/* Magnitudes over several decades, with a sign, so that blocks get very different scales. */
static void fill(float *x, size_t n, unsigned seed)
{
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        double u = (double)rand() / RAND_MAX - 0.5;
        double decade = pow(10.0, (double)((i / DEAR_Q8_BLOCK) % 7) - 3.0);
        x[i] = (float)(u * decade);
    }
}

static float scale_at(const void *q, size_t b)
{
    float s;
    memcpy(&s, (const char *)q + b * sizeof(float), sizeof s);
    return s;
}

/* Every block of x against the float64 reference. */
static void check_blocks(const float *x, size_t n)
{
    size_t bytes = dear_q8_bytes(n), nb = (n + DEAR_Q8_BLOCK - 1) / DEAR_Q8_BLOCK;
    ck_assert_uint_eq(bytes, nb * sizeof(float) + n);
    void *q = malloc(bytes + 1);
    float *v = malloc((n + 1) * sizeof(float));
    ck_assert(q != NULL && v != NULL);
    dear_reduce_q8_pack(q, x, NULL, n);
    dear_reduce_q8_unpack(v, q, n, 0);
    const int8_t *codes = (const int8_t *)((const char *)q + nb * sizeof(float));
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DEAR_Q8_BLOCK, hi = lo + DEAR_Q8_BLOCK < n ? lo + DEAR_Q8_BLOCK : n;
        double amax = 0.0;
        for (size_t i = lo; i < hi; i++)
            amax = fmax(amax, fabs((double)x[i]));
        double ref = amax / 127.0, s = scale_at(q, b);
        ck_assert_msg(fabs(s - ref) <= ref * 0x1p-23, "n %zu block %zu: scale %.9g, reference %.9g", n, b, s, ref);
        int top = 0;
        for (size_t i = lo; i < hi; i++) {
            double err = fabs((double)v[i] - (double)x[i]);
            ck_assert_msg(err <= ref * 0.5 * (1.0 + 0x1p-12),
                          "n %zu element %zu: %.9g became %.9g (code %d), error %.3g > scale / 2 = %.3g", n, i, x[i],
                          v[i], codes[i], err, ref * 0.5);
            ck_assert_int_le(abs(codes[i]), 127);
            top |= fabs((double)x[i]) == amax && abs(codes[i]) == 127;
        }
        ck_assert_msg(amax == 0.0 || top, "n %zu block %zu: the largest element does not code to +-127", n, b);
    }
    free(q);
    free(v);
}

START_TEST(test_blocks)
{
    const size_t ns[] = { 0, 1, 2, 255, 256, 257, 1000, 4096, 4096 + 3 };
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        float *x = malloc((ns[k] + 1) * sizeof(float));
        ck_assert(x != NULL);
        fill(x, ns[k], 7u + (unsigned)k);
        check_blocks(x, ns[k]);
        free(x);
    }
}
END_TEST

/* A zero block and blocks with NaN or an infinity, between finite ones. */
START_TEST(test_special)
{
    enum { B = DEAR_Q8_BLOCK, N = 5 * B };
    float *x = malloc(N * sizeof(float)), *v = malloc(N * sizeof(float));
    void *q = malloc(dear_q8_bytes(N));
    ck_assert(x != NULL && v != NULL && q != NULL);
    fill(x, N, 3);
    memset(x + B, 0, B * sizeof(float));
    x[2 * B + 5] = NAN;
    x[3 * B + 9] = -INFINITY;
    dear_reduce_q8_pack(q, x, NULL, N);
    dear_reduce_q8_unpack(v, q, N, 0);
    ck_assert(scale_at(q, 1) == 0.0f);
    for (size_t i = B; i < 2 * B; i++)
        ck_assert(v[i] == 0.0f && !signbit(v[i]));
    ck_assert(isnan(scale_at(q, 2)) && isnan(scale_at(q, 3)));
    for (size_t i = 2 * B; i < 4 * B; i++)
        ck_assert_msg(isnan(v[i]), "element %zu of a non-finite block is %g, not NaN", i, v[i]);
    for (size_t i = 0; i < N; i++)
        if (i < B || i >= 4 * B)
            ck_assert(isfinite(v[i]));
    /* The blocks around them code as they would alone. */
    check_blocks(x + 4 * B, B);
    free(x);
    free(v);
    free(q);
}
END_TEST

/* A block whose scale is a subnormal rounded down: amax = 190 * 2^-149 gives a scale of 2^-149,
 * so amax / scale is 190, past int8. The code must saturate at 127 with the sign kept (a wrapped
 * 190 would arrive as -66), and the values stay within the smallest subnormals of the input. */
START_TEST(test_subnormal_scale)
{
    enum { B = DEAR_Q8_BLOCK };
    float x[B], v[B];
    char q[B + sizeof(float)];
    for (int i = 0; i < B; i++)
        x[i] = ldexpf((float)((i * 37) % 191) * (i % 2 ? -1.0f : 1.0f), -149);
    x[0] = ldexpf(190.0f, -149);
    x[1] = -x[0];
    ck_assert_uint_eq(dear_q8_bytes(B), sizeof q);
    dear_reduce_q8_pack(q, x, NULL, B);
    ck_assert(scale_at(q, 0) == ldexpf(1.0f, -149));
    dear_reduce_q8_unpack(v, q, B, 0);
    const int8_t *codes = (const int8_t *)(q + sizeof(float));
    ck_assert_int_eq(codes[0], 127);
    ck_assert_int_eq(codes[1], -127);
    for (int i = 0; i < B; i++) {
        ck_assert_msg(signbit(v[i]) == signbit(x[i]) || v[i] == 0.0f, "element %d: %g became %g", i, x[i], v[i]);
        ck_assert_msg(fabsf(v[i]) <= fabsf(x[i]) && fabsf(x[i]) - fabsf(v[i]) <= ldexpf(63.0f, -149),
                      "element %d: %g became %g", i, x[i], v[i]);
    }
}
END_TEST

/* Error feedback: v + e == x for one step (float32 rounding aside), and over T steps of the same
 * gradient g the values sum to T g within one scale, where without feedback the error of each
 * element adds up T times. */
START_TEST(test_feedback)
{
    enum { N = 3 * DEAR_Q8_BLOCK + 17, T = 50 };
    float *g = malloc(N * sizeof(float)), *e = calloc(N, sizeof(float)), *v = malloc(N * sizeof(float));
    double *sum = calloc(N, sizeof(double)), *sum0 = calloc(N, sizeof(double));
    void *q = malloc(dear_q8_bytes(N));
    ck_assert(g != NULL && e != NULL && v != NULL && sum != NULL && sum0 != NULL && q != NULL);
    fill(g, N, 11);
    dear_reduce_q8_pack(q, g, e, N);
    dear_reduce_q8_unpack(v, q, N, 0);
    for (size_t i = 0; i < N; i++)
        ck_assert_msg(fabs((double)v[i] + (double)e[i] - (double)g[i]) <= (fabs(g[i]) + fabs(v[i])) * 0x1p-22,
                      "element %zu: value %.9g + residual %.9g != %.9g", i, v[i], e[i], g[i]);
    memset(e, 0, N * sizeof(float));
    for (int t = 0; t < T; t++) {
        dear_reduce_q8_pack(q, g, e, N);
        dear_reduce_q8_unpack(v, q, N, 0);
        for (size_t i = 0; i < N; i++)
            sum[i] += v[i];
        dear_reduce_q8_pack(q, g, NULL, N);
        dear_reduce_q8_unpack(v, q, N, 0);
        for (size_t i = 0; i < N; i++)
            sum0[i] += v[i];
    }
    double worst = 0.0, worst0 = 0.0;
    for (size_t b = 0; b * DEAR_Q8_BLOCK < N; b++) {
        size_t lo = b * DEAR_Q8_BLOCK, hi = lo + DEAR_Q8_BLOCK < N ? lo + DEAR_Q8_BLOCK : N;
        double amax = 0.0;
        for (size_t i = lo; i < hi; i++)
            amax = fmax(amax, fabs((double)g[i]));
        for (size_t i = lo; i < hi; i++) {
            double err = fabs(sum[i] - T * (double)g[i]) / (amax / 127.0);
            double err0 = fabs(sum0[i] - T * (double)g[i]) / (amax / 127.0);
            worst = fmax(worst, err);
            worst0 = fmax(worst0, err0);
        }
    }
    ck_assert_msg(worst <= 1.0, "with feedback the %d-step sum is %.3g scales off (accepted: 1)", T, worst);
    ck_assert_msg(worst0 > 10.0, "without feedback the %d-step sum is only %.3g scales off", T, worst0);
    free(g);
    free(e);
    free(v);
    free(sum);
    free(sum0);
    free(q);
}
END_TEST

START_TEST(test_accumulate)
{
    enum { N = 2 * DEAR_Q8_BLOCK + 1 };
    float x[N], v[N], acc[N];
    void *q = malloc(dear_q8_bytes(N));
    ck_assert(q != NULL);
    fill(x, N, 5);
    dear_reduce_q8_pack(q, x, NULL, N);
    dear_reduce_q8_unpack(v, q, N, 0);
    for (size_t i = 0; i < N; i++)
        acc[i] = 1.0f + (float)i;
    dear_reduce_q8_unpack(acc, q, N, 1);
    for (size_t i = 0; i < N; i++)
        ck_assert(acc[i] == (1.0f + (float)i) + v[i]);
    free(q);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("q8");
    TCase *tc = tcase_create("q8");
    tcase_add_test(tc, test_blocks);
    tcase_add_test(tc, test_special);
    tcase_add_test(tc, test_subnormal_scale);
    tcase_add_test(tc, test_feedback);
    tcase_add_test(tc, test_accumulate);
    suite_add_tcase(s, tc);
    return dear_ck_run(s);
}

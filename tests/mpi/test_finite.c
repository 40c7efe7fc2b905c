/*
 * DEAR_CHECK_FINITE (runtime/finite.c), under mpirun -np 3 (Check, CK_FORK=no). Rank 1 writes NaN
 * into 3 elements of tensor "b" in iteration 4, rank 2 an Inf into one element of "c" in
 * iteration 6; a float64 tensor holds 1e200 on every rank (its squares pass the largest double,
 * its values are finite). Under every schedule, sharded or not, on host memory (and the delayed
 * host row, built as test_finite_delay):
 *   - warn: the rank that made each one, and only that rank, names the tensor, the iteration and
 *     the count; no rank reports the float64 tensor; the updates of every rank see the non-finite
 *     average in exactly those iterations (GradScaler's skip stays the same on every rank);
 *   - off: nothing is reported.
 * `test_finite --abort` (finite-abort.sh) runs the same with DEAR_CHECK_FINITE=abort: the job
 * must end at iteration 4, non-zero, with rank 1's message.
 */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "include/dear.h"
#ifdef DEAR_TEST_MEM_DELAY
#include "tests/mpi/mem_delay.h"
#endif
#include "tests/mpi/suite_run.h"

static int rank, nranks;

#define ITERS 8
#define N 600
enum { TA, TB, TC, TD, NT };
static const char *const names[NT] = { "a", "b", "c", "d" };
static const int layers[NT] = { 0, 1, 1, 2 };

typedef struct {
    float g[3][N], w[3][N];     /* a, b, c: float32 */
    double gd[N], wd[N];        /* d: float64, huge values */
    int bad[NT][ITERS];         /* the update saw a non-finite average of tensor t in iteration it */
} model_t;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char logbuf[1 << 15];

static void sink(const char *line, void *arg)
{
    (void)arg;
    fputs(line, stderr);
    pthread_mutex_lock(&log_lock);
    strncat(logbuf, line, sizeof logbuf - strlen(logbuf) - 1);
    pthread_mutex_unlock(&log_lock);
}

static int update(const dear_update_info_t *u)
{
    model_t *m = u->arg;
    int nonfinite = 0;
    for (size_t i = 0; i < u->count; i++) {
        double g = u->dtype == DEAR_FLOAT64 ? ((const double *)u->grad)[i] : ((const float *)u->grad)[i];
        nonfinite |= !isfinite(g);
        if (u->tensor == TD)
            ((double *)u->param)[i] -= 1e-210 * g;
        else
            ((float *)u->param)[i] -= 0.01f * (float)g;
    }
    if (nonfinite)
        m->bad[u->tensor][u->iteration] = 1;
    return 0;
}

static void train(const char *sched, int shard, const char *mode)
{
    static model_t m;
    memset(&m, 0, sizeof m);
    setenv("DEAR_SCHEDULE", sched, 1);
    setenv("DEAR_CHECK_FINITE", mode, 1);
    setenv("DEAR_FUSION", "threshold", 1);
    setenv("DEAR_FUSION_THRESHOLD", "3k", 1);
#ifdef DEAR_TEST_MEM_DELAY
    mem_delay_install();
#endif
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    for (int t = 0; t < NT; t++) {
        void *g = t == TD ? (void *)m.gd : (void *)m.g[t], *w = t == TD ? (void *)m.wd : (void *)m.w[t];
        ck_assert_int_eq(dear_register(ctx, names[t], layers[t], g, N, t == TD ? DEAR_FLOAT64 : DEAR_FLOAT32,
                                       DEAR_MEM_HOST, update, &m),
                         DEAR_OK);
        ck_assert_int_eq(dear_set_param(ctx, t, w), DEAR_OK);
    }
    if (shard)
        ck_assert_int_eq(dear_set_shard(ctx, DEAR_SHARD_ON), DEAR_OK);
    logbuf[0] = '\0';
    dear_log_set_sink(sink, NULL);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    for (int it = 0; it < ITERS; it++) {
        for (int l = 0; l < 3; l++)
            ck_assert_int_eq(dear_forward_begin(ctx, l), DEAR_OK);
        for (int l = 2; l >= 0; l--) {
            for (int t = 0; t < NT; t++) {
                if (layers[t] != l)
                    continue;
                for (int i = 0; i < N; i++) {
                    if (t == TD)
                        m.gd[i] = 1e200 * (1 + 0.001 * i);
                    else
                        m.g[t][i] = (float)sin(0.1 * i + t + rank + it);
                }
                if (t == TB && rank == 1 % nranks && it == 4)
                    m.g[TB][10] = m.g[TB][311] = m.g[TB][599] = NAN;
                if (t == TC && rank == 2 % nranks && it == 6)
                    m.g[TC][42] = INFINITY;
            }
            ck_assert_int_eq(dear_backward_done(ctx, l), DEAR_OK);
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    dear_log_set_sink(NULL, NULL);
    ck_assert_int_eq(dear_finalize(&ctx), DEAR_OK);
    char what[96];
    snprintf(what, sizeof what, "%s%s, DEAR_CHECK_FINITE=%s, rank %d of %d", sched, shard ? " sharded" : "", mode, rank,
             nranks);
    int on = strcmp(mode, "off") != 0;
    int b_mine = rank == 1 % nranks, c_mine = rank == 2 % nranks;
    char want_b[128], want_c[128];
    snprintf(want_b, sizeof want_b, "rank %d: the gradient of tensor 'b' (layer 1, elements 0..600) has 3 non-finite "
             "values in iteration 4", rank);
    snprintf(want_c, sizeof want_c, "rank %d: the gradient of tensor 'c' (layer 1, elements 0..600) has 1 non-finite "
             "value in iteration 6", rank);
    ck_assert_msg(!!strstr(logbuf, want_b) == (on && b_mine), "%s: rank 1's NaN %s: %s", what,
                  on && b_mine ? "not reported" : "reported here", logbuf);
    ck_assert_msg(!!strstr(logbuf, want_c) == (on && c_mine), "%s: rank 2's Inf %s: %s", what,
                  on && c_mine ? "not reported" : "reported here", logbuf);
    ck_assert_msg(strstr(logbuf, "tensor 'a'") == NULL && strstr(logbuf, "tensor 'd'") == NULL,
                  "%s: a finite tensor reported: %s", what, logbuf);
    /* The values travel anyway: every rank's updates of b (it 4) and c (it 6) saw non-finite
     * averages (over the slices it owns when sharded: the ranks together). */
    for (int t = 0; t < NT; t++)
        for (int it = 0; it < ITERS; it++) {
            int want = (t == TB && it == 4) || (t == TC && it == 6), any = m.bad[t][it];
            if (shard)
                MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            ck_assert_msg(any == want, "%s: the update of '%s' in iteration %d saw %s average", what, names[t], it,
                          any ? "a non-finite" : "a finite");
        }
    unsetenv("DEAR_SCHEDULE");
    unsetenv("DEAR_CHECK_FINITE");
    unsetenv("DEAR_FUSION");
    unsetenv("DEAR_FUSION_THRESHOLD");
}

static const char *const scheds[] = { "dear", "wfbp", "sync" };

START_TEST(test_warn)
{
    train(scheds[_i % 3], _i >= 3, "warn");
}
END_TEST

START_TEST(test_off) { train("dear", 0, "off"); }
END_TEST

/* Never returns: rank 1 aborts the job at iteration 4. */
START_TEST(test_abort) { train("dear", 0, "abort"); }
END_TEST

int main(int argc, char **argv)
{
    mpi_suite_init(&argc, &argv, &rank, &nranks);
    Suite *s = suite_create("finite");
    TCase *tc = tcase_create("finite");
    tcase_set_timeout(tc, 300);
    if (argc > 1 && strcmp(argv[1], "--abort") == 0) {
        tcase_add_test(tc, test_abort);
    } else {
        tcase_add_loop_test(tc, test_warn, 0, 6);
        tcase_add_test(tc, test_off);
    }
    suite_add_tcase(s, tc);
    return mpi_suite_run(s, rank);
}

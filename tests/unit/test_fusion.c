/*
 * Unit tests of fusion/: cost model (fit, presets, scaling, per-size switch, cache file),
 * profiles (round trip, shipped files, errors naming the line), the simulator against timelines
 * worked by hand, MG-WFBP on a hand-worked example, the exact DPs against brute force (tensors
 * whole and cut into chunks), GradSSA (deterministic, never worse than its seeds, within 1% of DP
 * on every shipped profile), the unit cut (partitioned tensors) and every planner over 1, 2 and
 * many chunks, and plan files (round trip with cuts, version 1, refusal of a plan or a cut that
 * does not fit), and planning without a profile (fusion/estimate.h): layer costs from hints and
 * parameter bytes worked by hand, model descriptions (round trip, bad lines named, the shipped
 * ones consistent with the shipped profiles' times), the plan across the unknown scale against a
 * recomputation over separately scaled profiles, and the shipped models' estimate plans within 5%
 * of the plans made from their profiles. No MPI.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusion/cost.h"
#include "fusion/estimate.h"
#include "fusion/planfile.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "fusion/sim.h"
#include "fusion/units.h"
#include "include/dear.h"
#include "base/log.h"

#ifndef DEAR_SRCDIR
#define DEAR_SRCDIR "."
#endif

/* ---- helpers ---- */

static char logbuf[8192];
static void sink(const char *line, void *arg)
{
    (void)arg;
    size_t n = strlen(logbuf);
    snprintf(logbuf + n, sizeof logbuf - n, "%s\n", line);
}

static void capture(void)
{
    logbuf[0] = '\0';
    dear_log_set_sink(sink, NULL);
}

static void uncapture(void)
{
    dear_log_set_sink(NULL, NULL);
}

static char tmpdir[256];
static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dear-test-fusion-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        abort();
    }
}

static const char *tmpfile_path(const char *name)
{
    static char p[512];
    if (!tmpdir[0])
        make_tmpdir();
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* Profile from arrays; layer ids are 10*index so ids and indices differ. */
static void make_prof(dear_profile_t *p, int nl, const double *fwd, const double *bwd, int nt, const int *lay,
                      const size_t *bytes)
{
    dear_prof_init(p, "test");
    for (int l = 0; l < nl; l++)
        ck_assert_int_eq(dear_prof_add_layer(p, 10 * l, fwd[l], bwd[l]), DEAR_OK);
    for (int t = 0; t < nt; t++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", t);
        ck_assert_int_eq(dear_prof_add_tensor(p, name, 10 * lay[t], bytes[t]), DEAR_OK);
    }
    char msg[256];
    ck_assert_int_eq(dear_prof_check(p, msg, sizeof msg), DEAR_OK);
}

/* A plain linear cost model for the simulator: alpha[op] + beta[op] * bytes. */
typedef struct {
    double alpha[DEAR_COLL_OP_COUNT];
    double beta[DEAR_COLL_OP_COUNT];
} lin_arg_t;

static double lin_cost(void *arg, dear_coll_op_t op, size_t bytes)
{
    const lin_arg_t *l = arg;
    return l->alpha[op] + l->beta[op] * (double)bytes;
}

/* A format cost the plain one cannot produce: 100 s plus the format plus the op, per wire byte. */
static double fmt_cost(void *arg, dear_coll_op_t op, size_t wire, int c)
{
    (void)arg;
    return 100 + c + 10 * op + 1e-3 * (double)wire;
}

/* Group of p holding unit t, by binary search. */
static int group_of(const dear_partition_t *p, int t)
{
    int lo = 0, hi = p->ngroups - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (p->first[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static lin_arg_t lin(double a_ar, double b_ar, double a_half, double b_half)
{
    lin_arg_t l = { { 0 }, { 0 } };
    l.alpha[DEAR_COLL_ALLREDUCE] = a_ar;
    l.beta[DEAR_COLL_ALLREDUCE] = b_ar;
    l.alpha[DEAR_COLL_REDUCE_SCATTER] = l.alpha[DEAR_COLL_ALLGATHER] = a_half;
    l.beta[DEAR_COLL_REDUCE_SCATTER] = l.beta[DEAR_COLL_ALLGATHER] = b_half;
    return l;
}

static void problem_linear(dear_plan_problem_t *prob, const dear_profile_t *p, dear_sched_t s,
                           lin_arg_t *l)
{
    memset(prob, 0, sizeof *prob);
    prob->prof = p;
    prob->sched = s;
    prob->cost.fn = lin_cost;
    prob->cost.arg = l;
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        prob->alpha[op] = l->alpha[op];
        prob->beta[op] = l->beta[op];
    }
    prob->threshold = 500;
    prob->seed = 7;
}

static void plan2(dear_plan_t *plan, int n, int nrs, const int *rs, int nag, const int *ag)
{
    memset(plan, 0, sizeof *plan);
    plan->nunits = plan->ntensors = n;
    ck_assert_int_eq(dear_partition_set(&plan->rs, n, nrs, rs), DEAR_OK);
    ck_assert_int_eq(dear_partition_set(&plan->ag, n, nag, ag), DEAR_OK);
}

static double sim_T(const dear_profile_t *p, const dear_sim_cost_t *c, dear_sched_t s, const dear_plan_t *plan)
{
    dear_sim_result_t r = { 0 };
    ck_assert_int_eq(dear_sim_run(p, c, s, plan, 0, &r), DEAR_OK);
    return r.iter_s;
}

#define EQ(a, b) ck_assert_msg(fabs((double)(a) - (double)(b)) <= 1e-9 * (1 + fabs((double)(b))), "%s = %.12g, expected %.12g", #a, (double)(a), (double)(b))

/* ---- cost model ---- */

START_TEST(cost_fit_recovers_line)
{
    double x[8], y[8];
    for (int i = 0; i < 8; i++) {
        x[i] = 1024.0 * (1 << (2 * i));
        y[i] = 3e-5 + 2e-9 * x[i];
    }
    dear_cost_line_t l;
    ck_assert_int_eq(dear_cost_fit(x, y, 8, &l), DEAR_OK);
    EQ(l.alpha, 3e-5);
    EQ(l.beta, 2e-9);
    ck_assert(l.fit_err < 1e-9);
    ck_assert_int_eq(l.nsamples, 8);
    /* +-5% alternating noise: the fit error reports it. */
    for (int i = 0; i < 8; i++)
        y[i] *= (i % 2) ? 1.05 : 0.95;
    ck_assert_int_eq(dear_cost_fit(x, y, 8, &l), DEAR_OK);
    ck_assert(l.fit_err > 0.03 && l.fit_err < 0.08);
    ck_assert(fabs(l.beta / 2e-9 - 1) < 0.1);
    /* Bad input. */
    capture();
    ck_assert_int_eq(dear_cost_fit(x, y, 1, &l), DEAR_ERR_ARG);
    double same[3] = { 5, 5, 5 }, t3[3] = { 1, 2, 3 };
    ck_assert_int_eq(dear_cost_fit(same, t3, 3, &l), DEAR_ERR_ARG);
    ck_assert(strstr(logbuf, "distinct sizes") != NULL);
    double neg[2] = { -1, 1 };
    ck_assert_int_eq(dear_cost_fit(t3, neg, 2, &l), DEAR_ERR_ARG);
    uncapture();
}
END_TEST

START_TEST(cost_presets_and_scaling)
{
    dear_cost_model_t m;
    ck_assert_int_eq(dear_cost_preset("10gbe", 16, 1, &m), DEAR_OK);
    EQ(dear_cost_eval(&m, DEAR_COLL_ALLREDUCE, 0, NULL), 9.08e-4);
    EQ(dear_cost_eval(&m, DEAR_COLL_ALLREDUCE, 1e6, NULL), 9.08e-4 + 7.40e-4);
    EQ(dear_cost_eval(&m, DEAR_COLL_REDUCE_SCATTER, 1e6, NULL), (9.08e-4 + 7.40e-4) / 2);
    EQ(dear_cost_eval(&m, DEAR_COLL_ALLGATHER, 1e6, NULL), (9.08e-4 + 7.40e-4) / 2);
    ck_assert_int_eq(dear_cost_preset("ib56", 8, 1, &m), DEAR_OK);
    EQ(m.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING].alpha, 9.75e-5);
    EQ(m.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING].beta, 3.06e-10);
    /* P=64 from the P=16 fit: alpha x 63/15, beta x (63/64)/(15/16). */
    ck_assert_int_eq(dear_cost_preset("10gbe", 64, 1, &m), DEAR_OK);
    EQ(m.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING].alpha, 9.08e-4 * 63 / 15);
    EQ(m.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING].beta, 7.40e-10 * (63.0 / 64) / (15.0 / 16));
    ck_assert_int_eq(m.comm_size, 64);
    ck_assert_int_eq(dear_cost_preset("shm", 4, 4, &m), DEAR_OK);
    ck_assert(m.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_RING].valid);
    capture();
    ck_assert_int_eq(dear_cost_preset("token-ring", 16, 1, &m), DEAR_ERR_ARG);
    ck_assert(strstr(logbuf, "token-ring") && strstr(logbuf, "10gbe|ib56|shm"));
    uncapture();
}
END_TEST

START_TEST(cost_per_size_switch)
{
    dear_cost_model_t m;
    memset(&m, 0, sizeof m);
    m.comm_size = 8;
    /* rhd: cheap start-up, poor bandwidth; ring: the reverse. They cross at 1e5 bytes. */
    m.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RHD] = (dear_cost_line_t){ .valid = 1, .alpha = 1e-5, .beta = 1e-9 };
    m.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING] = (dear_cost_line_t){ .valid = 1, .alpha = 6e-5, .beta = 5e-10 };
    int algo;
    EQ(dear_cost_eval(&m, DEAR_COLL_ALLREDUCE, 1000, &algo), 1e-5 + 1e-6);
    ck_assert_int_eq(algo, DEAR_ALGO_RHD);
    EQ(dear_cost_eval(&m, DEAR_COLL_ALLREDUCE, 1e6, &algo), 6e-5 + 5e-4);
    ck_assert_int_eq(algo, DEAR_ALGO_RING);
    ck_assert(isinf(dear_cost_eval(&m, DEAR_COLL_REDUCE_SCATTER, 10, &algo)));
    ck_assert_int_eq(algo, -1);
    /* The linear stand-in is between the two lines' extremes. */
    double a, b;
    ck_assert_int_eq(dear_cost_linear(&m, DEAR_COLL_ALLREDUCE, &a, &b), DEAR_OK);
    ck_assert(a >= 0 && a < 6e-5 * 1.5 && b > 4e-10 && b < 1.1e-9);
    /* Through the simulator's cost function, with a cap. */
    dear_sim_model_arg_t arg = { &m, 4096 };
    EQ(dear_sim_cost_model(&arg, DEAR_COLL_ALLREDUCE, 1000), 1.1e-5);
    ck_assert(dear_sim_cost_model(&arg, DEAR_COLL_ALLREDUCE, 8192) > DEAR_SIM_CAP_PENALTY_S);
}
END_TEST

START_TEST(cost_file_round_trip)
{
    const char *path = tmpfile_path("cal.txt");
    unlink(path);
    dear_cost_model_t m8, m16, back;
    int found = -1;
    ck_assert_int_eq(dear_cost_load(path, 8, 1, &back, &found), DEAR_OK);   /* missing file: nothing */
    ck_assert_int_eq(found, 0);
    ck_assert_int_eq(dear_cost_preset("10gbe", 8, 1, &m8), DEAR_OK);
    ck_assert_int_eq(dear_cost_preset("ib56", 16, 2, &m16), DEAR_OK);
    m16.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_MPI] =
        (dear_cost_line_t){ .valid = 1, .alpha = 1.25e-4, .beta = 3.5e-10, .gamma = 1e-11, .fit_err = 0.04,
                            .nsamples = 12 };
    ck_assert_int_eq(dear_cost_save(path, &m8), DEAR_OK);
    ck_assert_int_eq(dear_cost_save(path, &m16), DEAR_OK);
    ck_assert_int_eq(dear_cost_load(path, 16, 2, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 4);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        for (int a = 0; a < DEAR_ALGO_COUNT; a++) {
            const dear_cost_line_t *x = &m16.line[op][a], *y = &back.line[op][a];
            ck_assert_int_eq(x->valid, y->valid);
            if (x->valid) {
                EQ(y->alpha, x->alpha);
                EQ(y->beta, x->beta);
                EQ(y->gamma, x->gamma);
                ck_assert_int_eq(y->nsamples, x->nsamples);
            }
        }
    ck_assert_int_eq(dear_cost_load(path, 8, 1, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 3);
    EQ(back.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING].alpha, 5.23e-4);
    /* Saving the same key again replaces, not appends. */
    m8.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING].alpha = 1e-3;
    ck_assert_int_eq(dear_cost_save(path, &m8), DEAR_OK);
    ck_assert_int_eq(dear_cost_load(path, 8, 1, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 3);
    EQ(back.line[DEAR_COLL_ALLREDUCE][DEAR_ALGO_RING].alpha, 1e-3);
    /* A bad line names file and line. */
    write_file(path, "dear-cost 1\n8 1 ar ring 1e-4 1e-9 0 0 0\n8 1 ar carrier-pigeon 1 1 0 0 0\n");
    capture();
    ck_assert_int_eq(dear_cost_load(path, 8, 1, &back, &found), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(logbuf, "cal.txt:3:") != NULL, "log: %s", logbuf);
    uncapture();
}
END_TEST

/* m saved to path (merged with what it holds) and loaded back for m's key into *back; returns
 * the records found. */
static int cache_round_trip(const char *path, const dear_cost_model_t *m, dear_cost_model_t *back)
{
    int found = -1;
    ck_assert_int_eq(dear_cost_save(path, m), DEAR_OK);
    ck_assert_int_eq(dear_cost_load(path, m->comm_size, m->ranks_per_host, back, &found), DEAR_OK);
    return found;
}

/* Each of bad[0..n), between the cache text before and after, is refused by the cache reader
 * (whatever the key), whose error names the file and line (where) and what it accepts (what).
 * Run under capture(). */
static void cache_refuses(const char *path, const char *before, const char *after, const char *const *bad, size_t n,
                          const char *where, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        char text[200];
        dear_cost_model_t back;
        int found = 0;
        snprintf(text, sizeof text, "%s%s%s", before, bad[i], after);
        write_file(path, text);
        logbuf[0] = '\0';
        ck_assert_int_eq(dear_cost_load(path, 4, 1, &back, &found), DEAR_ERR_FORMAT);
        ck_assert_msg(strstr(logbuf, where) && strstr(logbuf, what), "%s: log: %s", bad[i], logbuf);
    }
}

/* A measured cost that is not one line (a burst allowance, an algorithm switch at 1 MiB): the
 * curve reproduces every sample, interpolates between them and extends at the largest sample's
 * time per byte; noise
 * that makes a larger size cheaper is flattened; the cache file keeps the points. */
START_TEST(cost_curve)
{
    double x[5] = { 1u << 20, 8192, 131072, 4u << 20, 2u << 20 };    /* unsorted on purpose */
    double y[5] = { 6.6e-3, 4.5e-4, 5.0e-4, 32.2e-3, 16.0e-3 };
    dear_cost_line_t l;
    ck_assert_int_eq(dear_cost_fit_curve(x, y, 5, &l), DEAR_OK);
    ck_assert_int_eq(l.npts, 5);
    ck_assert(l.fit_err > 0.1); /* far from linear, and the straight fit says so */
    for (int i = 0; i < 5; i++)
        EQ(dear_cost_line_eval(&l, x[i]), y[i]);
    EQ(dear_cost_line_eval(&l, 3u << 20), (16.0e-3 + 32.2e-3) / 2);
    /* Beyond the largest: its own time per byte (32.2 ms per 4 MiB). With 2 MiB measured slow
     * (yslow), the last segment's slope would be 10 ms per 2 MiB, a rate no stream reached. */
    EQ(dear_cost_line_eval(&l, 16u << 20), 4 * 32.2e-3);
    double yslow[5] = { 6.6e-3, 4.5e-4, 5.0e-4, 32.2e-3, 22.2e-3 };
    dear_cost_line_t ls;
    ck_assert_int_eq(dear_cost_fit_curve(x, yslow, 5, &ls), DEAR_OK);
    EQ(dear_cost_line_eval(&ls, 8u << 20), 2 * 32.2e-3);
    EQ(dear_cost_line_eval(&ls, 3u << 20), (22.2e-3 + 32.2e-3) / 2);
    /* Below the smallest: no cheaper than the smallest (a steep first segment must not reach
     * zero: the linear stand-in's fit refuses a 0 s sample). */
    EQ(dear_cost_line_eval(&l, 0), 4.5e-4);
    EQ(dear_cost_line_eval(&l, 4096), 4.5e-4);
    /* A dip is noise: 128 KiB measured faster than 8 KiB is priced like 8 KiB. */
    y[2] = 3e-4;
    ck_assert_int_eq(dear_cost_fit_curve(x, y, 5, &l), DEAR_OK);
    EQ(dear_cost_line_eval(&l, 131072), 4.5e-4);
    for (double b = 1024; b < 64e6; b *= 1.5)
        ck_assert(dear_cost_line_eval(&l, b * 1.5) >= dear_cost_line_eval(&l, b));
    /* In a model the auto curve is the cost, even where another line is cheaper. */
    dear_cost_model_t m;
    memset(&m, 0, sizeof m);
    m.comm_size = 4;
    m.ranks_per_host = 1;
    m.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_RING] = (dear_cost_line_t){ .valid = 1, .alpha = 1e-6, .beta = 1e-12 };
    m.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_AUTO] = l;
    int algo;
    EQ(dear_cost_eval(&m, DEAR_COLL_REDUCE_SCATTER, 1u << 20, &algo), 6.6e-3);
    ck_assert_int_eq(algo, DEAR_ALGO_AUTO);
    /* The linear stand-in is fitted through the curve (4 KiB..256 MiB), not the curve's own
     * straight fit of 5 samples: its slope lies between the curve's first and last. */
    double a, b;
    ck_assert_int_eq(dear_cost_linear(&m, DEAR_COLL_REDUCE_SCATTER, &a, &b), DEAR_OK);
    ck_assert_msg(a >= 0 && b > 2e-9 && b < 8.2e-9 && b != l.beta, "alpha %g beta %g", a, b);
    /* Scaling to 8 ranks keeps the points' order and grows them. */
    dear_cost_model_t m8;
    ck_assert_int_eq(dear_cost_scale(&m, 8, &m8), DEAR_OK);
    ck_assert_int_eq(m8.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_AUTO].npts, 5);
    for (int i = 0; i < 5; i++)
        ck_assert(m8.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_AUTO].pt_sec[i] >= l.pt_sec[i]);
    /* Round trip through the cache file, 9 significant digits. */
    const char *path = tmpfile_path("curve.txt");
    unlink(path);
    dear_cost_model_t back;
    ck_assert_int_eq(cache_round_trip(path, &m, &back), 2);
    const dear_cost_line_t *bl = &back.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_AUTO];
    ck_assert_int_eq(bl->npts, 5);
    for (int i = 0; i < 5; i++) {
        EQ(bl->pt_bytes[i], l.pt_bytes[i]);
        ck_assert(fabs(bl->pt_sec[i] - l.pt_sec[i]) <= 1e-8 * l.pt_sec[i]);
    }
    ck_assert_int_eq(back.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_RING].npts, 0);
    /* Bad points name the file, the line and what is accepted; bad input to the fit is refused. */
    static const char *const bad[] = { "8192:1e-4", "8192:1e-4,4096:2e-4", "8192:2e-4,16384:1e-4",
                                       "8192-1e-4,16384:2e-4", "8192:x,16384:2e-4", "8192:0,16384:2e-4" };
    capture();
    cache_refuses(path, "dear-cost 1\n4 1 rs auto 1e-4 1e-9 0 0 2 ", "\n", bad, sizeof bad / sizeof bad[0],
                  "curve.txt:2:", "BYTES:SECONDS");
    double same[2] = { 5, 5 }, t2[2] = { 1, 2 }, many[DEAR_COST_MAXPTS + 1];
    ck_assert_int_eq(dear_cost_fit_curve(same, t2, 2, &l), DEAR_ERR_ARG);
    for (int i = 0; i <= DEAR_COST_MAXPTS; i++)
        many[i] = i + 1;
    ck_assert_int_eq(dear_cost_fit_curve(many, many, DEAR_COST_MAXPTS + 1, &l), DEAR_ERR_ARG);
    ck_assert(strstr(logbuf, "at most") != NULL);
    uncapture();
    unlink(path);
}
END_TEST

/* A compressed format's curve prices its collectives by wire bytes; a format without one falls
 * back to the float32 curve at the wire bytes; the cache keeps it as auto+FORMAT and refuses
 * any other spelling; scaling grows it like the auto line. */
START_TEST(cost_format_curves)
{
    dear_cost_model_t m;
    memset(&m, 0, sizeof m);
    m.comm_size = 4;
    m.ranks_per_host = 2;
    m.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_AUTO] = (dear_cost_line_t){ .valid = 1, .alpha = 1e-4, .beta = 1e-9 };
    double x[3] = { 2080, 16640, 133120 }, y[3] = { 3e-4, 5e-4, 9e-4 };
    dear_cost_line_t *q8 = &m.fmt[DEAR_COMPRESS_INT8][DEAR_COLL_REDUCE_SCATTER];
    ck_assert_int_eq(dear_cost_fit_curve(x, y, 3, q8), DEAR_OK);
    EQ(dear_cost_eval_fmt(&m, DEAR_COLL_REDUCE_SCATTER, DEAR_COMPRESS_INT8, 16640), 5e-4);
    EQ(dear_cost_eval_fmt(&m, DEAR_COLL_REDUCE_SCATTER, DEAR_COMPRESS_BF16, 16640), 1e-4 + 1e-9 * 16640);
    EQ(dear_cost_eval_fmt(&m, DEAR_COLL_REDUCE_SCATTER, DEAR_COMPRESS_NONE, 16640), 1e-4 + 1e-9 * 16640);
    EQ(dear_cost_eval_fmt(&m, DEAR_COLL_REDUCE_SCATTER, 99, 16640), 1e-4 + 1e-9 * 16640);
    ck_assert(!isfinite(dear_cost_eval_fmt(&m, DEAR_COLL_ALLGATHER, DEAR_COMPRESS_INT8, 16640)));

    const char *path = tmpfile_path("fmt.txt");
    unlink(path);
    dear_cost_model_t back;
    ck_assert_int_eq(cache_round_trip(path, &m, &back), 2);
    FILE *f = fopen(path, "r");
    char text[4096] = "";
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = '\0';
    ck_assert_msg(strstr(text, "\n4 2 rs auto+int8 ") != NULL, "file: %s", text);
    const dear_cost_line_t *bq = &back.fmt[DEAR_COMPRESS_INT8][DEAR_COLL_REDUCE_SCATTER];
    ck_assert_int_eq(bq->npts, 3);
    for (int i = 0; i < 3; i++)
        ck_assert(fabs(bq->pt_sec[i] - y[i]) <= 1e-8 * y[i]);
    ck_assert(!back.fmt[DEAR_COMPRESS_BF16][DEAR_COLL_REDUCE_SCATTER].valid);
    ck_assert(!back.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_RING].valid);
    /* Saving again replaces the layout's records, format curves included: no duplicates. */
    ck_assert_int_eq(cache_round_trip(path, &m, &back), 2);

    static const char *const bad[] = { "auto+none", "ring+int8", "auto+int4", "auto+", "+int8" };
    capture();
    cache_refuses(path, "dear-cost 1\n4 2 rs ", " 1e-4 1e-9 0 0 2\n", bad, sizeof bad / sizeof bad[0], "fmt.txt:2:",
                  "auto+FORMAT");
    uncapture();
    unlink(path);

    dear_cost_model_t m8;
    ck_assert_int_eq(dear_cost_scale(&m, 8, &m8), DEAR_OK);
    for (int i = 0; i < 3; i++)
        ck_assert(m8.fmt[DEAR_COMPRESS_INT8][DEAR_COLL_REDUCE_SCATTER].pt_sec[i] > y[i]);
}
END_TEST

/* Burst curves (auto/K): the factor on a queued collective is the burst curve over the auto line
 * from the burst's smallest size (below it, its ratio) to its largest (beyond it, 1); without
 * either curve, 1. The cache keeps them by K: load_ex takes only the K asked for, a save keeps
 * another K's records, and a bad K or a burst of anything but auto is refused. */
START_TEST(cost_burst_curves)
{
    dear_cost_model_t m;
    memset(&m, 0, sizeof m);
    m.comm_size = 8;
    m.ranks_per_host = 4;
    dear_coll_op_t rs = DEAR_COLL_REDUCE_SCATTER;
    double xa[3] = { 8192, 65536, 262144 }, ya[3] = { 1e-3, 2e-3, 8e-3 };
    double xb[2] = { 8192, 65536 }, yb[2] = { 1.5e-3, 2.2e-3 };
    ck_assert_int_eq(dear_cost_fit_curve(xa, ya, 3, &m.line[rs][DEAR_ALGO_AUTO]), DEAR_OK);
    EQ(dear_cost_queued_factor(&m, rs, 8192), 1);   /* no burst curve */
    ck_assert_int_eq(dear_cost_fit_curve(xb, yb, 2, &m.burst[rs]), DEAR_OK);
    EQ(dear_cost_queued_factor(&m, rs, 8192), 1);   /* burst_k unset */
    m.burst_k = 4;
    EQ(dear_cost_queued_factor(&m, rs, 8192), 1.5);
    EQ(dear_cost_queued_factor(&m, rs, 1024), 1.5);     /* below: the smallest size's ratio */
    EQ(dear_cost_queued_factor(&m, rs, 65536), 1.1);
    EQ(dear_cost_queued_factor(&m, rs, 36864), 1.85e-3 / 1.5e-3);
    EQ(dear_cost_queued_factor(&m, rs, 65537), 1);      /* beyond what was measured */
    EQ(dear_cost_queued_factor(&m, DEAR_COLL_ALLGATHER, 8192), 1);
    dear_sim_model_arg_t marg = { .model = &m };
    EQ(dear_sim_cost_model_queued(&marg, rs, 8192), 1.5);

    const char *path = tmpfile_path("burst.txt");
    unlink(path);
    dear_cost_model_t back, other = m;
    ck_assert_int_eq(dear_cost_save(path, &m), DEAR_OK);
    int found = -1;
    ck_assert_int_eq(dear_cost_load(path, 8, 4, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 1);                         /* the auto line alone */
    ck_assert_int_eq(back.burst_k, 0);
    ck_assert(!back.burst[rs].valid);
    ck_assert_int_eq(dear_cost_load_ex(path, 8, 4, 8, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 1);
    ck_assert_int_eq(dear_cost_load_ex(path, 8, 4, 4, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 2);
    ck_assert_int_eq(back.burst_k, 4);
    ck_assert_int_eq(back.burst[rs].npts, 2);
    EQ(dear_cost_queued_factor(&back, rs, 8192), 1.5);
    /* Another K is added beside it; saving K = 4 again replaces only its own record. */
    other.burst_k = 8;
    other.burst[rs].pt_sec[0] = 3e-3;
    other.burst[rs].pt_sec[1] = 4e-3;
    ck_assert_int_eq(dear_cost_save(path, &other), DEAR_OK);
    ck_assert_int_eq(dear_cost_save(path, &m), DEAR_OK);
    ck_assert_int_eq(dear_cost_load_ex(path, 8, 4, 8, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 2);
    EQ(dear_cost_queued_factor(&back, rs, 8192), 3);
    ck_assert_int_eq(dear_cost_load_ex(path, 8, 4, 4, &back, &found), DEAR_OK);
    EQ(dear_cost_queued_factor(&back, rs, 8192), 1.5);
    FILE *f = fopen(path, "r");
    char text[4096] = "";
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[got] = '\0';
    ck_assert_msg(strstr(text, "\n8 4 rs auto/4 ") && strstr(text, "\n8 4 rs auto/8 "), "file: %s", text);
    ck_assert_msg(strstr(strstr(text, "\n8 4 rs auto/4 ") + 1, "\n8 4 rs auto/4 ") == NULL, "twice: %s", text);

    static const char *const bad[] = { "auto/1", "auto/65", "auto/x", "auto/", "ring/4", "auto+int8/4", "auto/4+int8" };
    capture();
    cache_refuses(path, "dear-cost 1\n4 1 rs ", " 1e-4 1e-9 0 0 2\n", bad, sizeof bad / sizeof bad[0], "burst.txt:2:",
                  "auto/K");
    uncapture();
    unlink(path);
}
END_TEST

/* The idle curve (auto@idle): a collective starting on an idle link costs the auto line at the
 * idle curve's smallest size plus the idle curve's least-squares slope beyond it, over the line,
 * plus DEAR_COST_IDLE_TOL, never above 1. A curve shifted down by one fixed time (a burst
 * allowance) prices nothing; one of a lower slope (a queue the stream builds) does, more the
 * larger the collective. The cache keeps it whatever K is loaded; a malformed name is refused at
 * its line. */
START_TEST(cost_idle_curves)
{
    dear_cost_model_t m;
    memset(&m, 0, sizeof m);
    m.comm_size = 8;
    m.ranks_per_host = 4;
    dear_coll_op_t ar = DEAR_COLL_ALLREDUCE;
    const double MiB = 1 << 20, tol = DEAR_COST_IDLE_TOL;
    /* back to back: 0.1 s per MiB from 1 MiB on */
    double xa[3] = { 65536, MiB, 4 * MiB }, ya[3] = { 1e-3, 0.1, 0.4 };
    double xi[3] = { MiB, 2 * MiB, 4 * MiB }, burst[3] = { 0.05, 0.15, 0.35 }, yi[3] = { 0.08, 0.16, 0.32 };
    ck_assert_int_eq(dear_cost_fit_curve(xa, ya, 3, &m.line[ar][DEAR_ALGO_AUTO]), DEAR_OK);
    EQ(dear_cost_idle_factor(&m, ar, 2 * MiB), 1);       /* no idle curve */
    ck_assert_int_eq(dear_cost_fit_curve(xi, burst, 3, &m.idle[ar]), DEAR_OK);
    for (int k = 0; k < 4; k++) /* 50 ms faster at every size, at the same slope: a burst allowance */
        EQ(dear_cost_idle_factor(&m, ar, MiB * (1 << k)), 1);
    ck_assert_int_eq(dear_cost_fit_curve(xi, yi, 3, &m.idle[ar]), DEAR_OK);
    /* 0.08 s per MiB alone: from the line's 0.1 s at 1 MiB, 0.18 s at 2 MiB, 0.34 at 4, 0.66 at 8
     * (beyond both curves: the line at its largest point's rate, 0.8 s) */
    EQ(dear_cost_idle_factor(&m, ar, MiB), 1);           /* at the smallest size: the stream's price */
    EQ(dear_cost_idle_factor(&m, ar, 2 * MiB), 0.18 / 0.2 + tol);
    EQ(dear_cost_idle_factor(&m, ar, 4 * MiB), 0.34 / 0.4 + tol);
    EQ(dear_cost_idle_factor(&m, ar, 8 * MiB), 0.66 / 0.8 + tol);
    EQ(dear_cost_idle_factor(&m, ar, 65536), 1);         /* below: not measured, the stream's price */
    EQ(dear_cost_idle_factor(&m, DEAR_COLL_REDUCE_SCATTER, 2 * MiB), 1);
    dear_sim_model_arg_t marg = { .model = &m };
    EQ(dear_sim_cost_model_idle(&marg, ar, 4 * MiB), 0.34 / 0.4 + tol);
    dear_cost_model_t slow = m;
    slow.idle[ar].pt_sec[0] = 0.2;                       /* steeper alone than back to back: noise */
    slow.idle[ar].pt_sec[1] = 0.35;
    slow.idle[ar].pt_sec[2] = 0.7;
    EQ(dear_cost_idle_factor(&slow, ar, 4 * MiB), 1);
    dear_cost_model_t near = m;                          /* 2% below the stream's slope: within the tolerance */
    for (int i = 0; i < 3; i++)
        near.idle[ar].pt_sec[i] = 0.098 * (1 << i);
    EQ(dear_cost_idle_factor(&near, ar, 8 * MiB), 1);

    const char *path = tmpfile_path("idle.txt");
    unlink(path);
    ck_assert_int_eq(dear_cost_save(path, &m), DEAR_OK);
    dear_cost_model_t back;
    int found = -1;
    ck_assert_int_eq(dear_cost_load_ex(path, 8, 4, 4, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 2);
    ck_assert_int_eq(back.burst_k, 0);
    EQ(dear_cost_idle_factor(&back, ar, 4 * MiB), 0.34 / 0.4 + tol);
    ck_assert_int_eq(dear_cost_load(path, 8, 4, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 2);
    /* Saving again replaces the record rather than adding one. */
    ck_assert_int_eq(dear_cost_save(path, &slow), DEAR_OK);
    ck_assert_int_eq(dear_cost_load(path, 8, 4, &back, &found), DEAR_OK);
    ck_assert_int_eq(found, 2);
    EQ(back.idle[ar].pt_sec[0], 0.2);
    dear_cost_model_t m16;
    ck_assert_int_eq(dear_cost_scale(&m, 16, &m16), DEAR_OK);
    ck_assert(m16.idle[ar].valid && m16.idle[ar].pt_sec[1] > yi[1]);

    static const char *const bad[] = { "auto@idl", "ring@idle", "auto@idle/4", "auto+bf16@idle", "auto@", "@idle" };
    capture();
    cache_refuses(path, "dear-cost 1\n4 1 ar ", " 1e-4 1e-9 0 0 2\n", bad, sizeof bad / sizeof bad[0], "idle.txt:2:",
                  "auto@idle");
    uncapture();
    unlink(path);
}
END_TEST

/* ---- profiles ---- */

START_TEST(profile_round_trip)
{
    double fw[3] = { 0.001, 0.0025, 1e-7 }, bw[3] = { 0.002, 0.005, 3e-7 };
    int lay[4] = { 0, 1, 1, 2 };
    size_t by[4] = { 4096, 1 << 20, 12, 5000000000ull };
    dear_profile_t p, q = { 0 };
    make_prof(&p, 3, fw, bw, 4, lay, by);
    const char *path = tmpfile_path("p.prof");
    ck_assert_int_eq(dear_prof_save(&p, path), DEAR_OK);
    ck_assert_int_eq(dear_prof_load(path, &q), DEAR_OK);
    ck_assert_str_eq(q.model, "test");
    ck_assert_int_eq(q.nlayers, 3);
    ck_assert_int_eq(q.ntensors, 4);
    for (int l = 0; l < 3; l++) {
        ck_assert_int_eq(q.layers[l].id, p.layers[l].id);
        EQ(q.layers[l].fwd_s, fw[l]);
        EQ(q.layers[l].bwd_s, bw[l]);
    }
    for (int t = 0; t < 4; t++) {
        ck_assert_str_eq(q.tensors[t].name, p.tensors[t].name);
        ck_assert_int_eq(q.tensors[t].layer, 10 * lay[t]);
        ck_assert_int_eq(q.tensors[t].lidx, lay[t]);
        ck_assert_uint_eq(q.tensors[t].bytes, by[t]);
    }
    dear_prof_free(&p);
    dear_prof_free(&q);
}
END_TEST

/* A sparse tensor's record survives a save and a load, and its wire bytes per phase are its
 * non-zero blocks with a 4-byte index each, never more than dense. */
START_TEST(profile_sparse_round_trip)
{
    double fw[2] = { 0.001, 0.002 }, bw[2] = { 0.002, 0.004 };
    int lay[2] = { 0, 1 };
    size_t by[2] = { 4096, 1 << 20 };
    dear_profile_t p, q = { 0 };
    make_prof(&p, 2, fw, bw, 2, lay, by);
    p.tensors[1].block_bytes = 1024;
    p.tensors[1].density_rs = 0.25;
    p.tensors[1].density_ag = 0.5;
    const char *path = tmpfile_path("sparse.prof");
    ck_assert_int_eq(dear_prof_save(&p, path), DEAR_OK);
    ck_assert_int_eq(dear_prof_load(path, &q), DEAR_OK);
    ck_assert_uint_eq(q.tensors[0].block_bytes, 0);
    ck_assert_uint_eq(q.tensors[1].block_bytes, 1024);
    EQ(q.tensors[1].density_rs, 0.25);
    EQ(q.tensors[1].density_ag, 0.5);
    EQ(dear_prof_wire_bytes(&q.tensors[0], DEAR_COLL_REDUCE_SCATTER), 4096);
    /* 256 of 1024 blocks, each 1024 + 4 bytes. */
    EQ(dear_prof_wire_bytes(&q.tensors[1], DEAR_COLL_REDUCE_SCATTER), 256 * 1028);
    EQ(dear_prof_wire_bytes(&q.tensors[1], DEAR_COLL_ALLREDUCE), 256 * 1028);
    EQ(dear_prof_wire_bytes(&q.tensors[1], DEAR_COLL_ALLGATHER), 512 * 1028);
    q.tensors[1].density_ag = 1;
    EQ(dear_prof_wire_bytes(&q.tensors[1], DEAR_COLL_ALLGATHER), 1 << 20);
    char msg[256];
    q.tensors[1].block_bytes = 1000;
    ck_assert_int_eq(dear_prof_check(&q, msg, sizeof msg), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(msg, "must divide") != NULL, "%s", msg);
    dear_prof_free(&p);
    dear_prof_free(&q);
}
END_TEST

START_TEST(profile_shipped)
{
    static const struct {
        const char *name;
        long long params;
        int tensors;
        const char *sparse;     /* the one tensor with a `sparse` record, or NULL */
    } models[] = { { "resnet50", 25557032, 161, NULL },
                   { "vgg16", 138357544, 32, NULL },
                   { "densenet201", 20013928, 604, NULL },
                   { "bert-base", 109482240, 199, "embeddings.word_embeddings.weight" },
                   { "gpt2-small", 124439808, 148, NULL },
                   { "gpt2-small-untied", 124439808 + 50257LL * 768, 149, "wte.weight" } };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/fusion/profiles/%s.prof", DEAR_SRCDIR, models[i].name);
        dear_profile_t p = { 0 };
        ck_assert_int_eq(dear_prof_load(path, &p), DEAR_OK);
        ck_assert_str_eq(p.model, models[i].name);
        ck_assert_int_eq(p.ntensors, models[i].tensors);
        ck_assert_uint_eq(dear_prof_bytes_total(&p), (size_t)models[i].params * 4);
        ck_assert(dear_prof_fwd_total(&p) > 0.01 && dear_prof_bwd_total(&p) > dear_prof_fwd_total(&p));
        /* A sparse embedding's block is its row of 768 floats; a batch touches a few percent of
         * the rows, four ranks together more, but far from all. */
        int nsparse = 0;
        for (int t = 0; t < p.ntensors; t++) {
            const dear_prof_tensor_t *pt = &p.tensors[t];
            if (pt->block_bytes == 0)
                continue;
            nsparse++;
            ck_assert_ptr_nonnull(models[i].sparse);
            ck_assert_str_eq(pt->name, models[i].sparse);
            ck_assert_uint_eq(pt->block_bytes, 768 * 4);
            ck_assert(pt->density_rs > 0.01 && pt->density_rs < 0.1);
            ck_assert(pt->density_ag > pt->density_rs && pt->density_ag < 4 * pt->density_rs);
        }
        ck_assert_int_eq(nsparse, models[i].sparse != NULL);
        dear_prof_free(&p);
    }
}
END_TEST

START_TEST(profile_bad_lines)
{
    static const struct {
        const char *text;
        const char *expect;   /* in the error, after "FILE:LINE:" */
        int line;
    } cases[] = {
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nend 1 1\n", NULL, 0 },
        { "dear-profile 2\n", "header", 1 },
        { "dear-profile 1\nlayer 0 1 2\nlayer x 1 2\n", "layer ID", 3 },
        { "dear-profile 1\n# c\nlayer 0 1 -2\n", "times in [0, 3600] seconds", 3 },
        { "dear-profile 1\nlayer 5 1 2\nlayer 5 1 2\n", "does not increase", 3 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 3 8\n", "no layer line declares", 3 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 0\n", "BYTES", 3 },
        { "dear-profile 1\nlayer 0 1 2\nlayer 1 1 2\ntensor a 1 8\ntensor b 0 8\n", "forward order", 5 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nbogus 1\n", "unknown record", 4 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nend 1 2\n", "the file has", 4 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\n", "truncated", 3 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nend 1 1\nlayer 1 1 1\n", "after the 'end'", 5 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nsparse a 4 0.5 1\nend 1 1\n", NULL, 0 },
        { "dear-profile 1\nlayer 0 1 2\nsparse a 4 0.5 1\n", "must follow the tensor line", 3 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\ntensor b 0 8\nsparse a 4 0.5 1\n", "must follow", 5 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nsparse a 4 1.5 1\n", "densities in [0, 1]", 4 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nsparse a 4 0.5 -0.1\n", "densities in [0, 1]", 4 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nsparse a 0 0.5 1\n", "block >= 1 byte", 4 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nsparse a 3 0.5 1\n", "do not divide its 8 bytes", 4 },
        { "dear-profile 1\nlayer 0 1 2\ntensor a 0 8\nsparse a 4 0.5 1\nsparse a 4 0.5 1\n", "sparse twice", 5 },
    };
    char path[512];
    snprintf(path, sizeof path, "%s", tmpfile_path("bad.prof"));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(path, cases[i].text);
        dear_profile_t p = { 0 };
        capture();
        int rc = dear_prof_load(path, &p);
        uncapture();
        if (!cases[i].expect) {
            ck_assert_int_eq(rc, DEAR_OK);
            dear_prof_free(&p);
            continue;
        }
        ck_assert_msg(rc == DEAR_ERR_FORMAT, "case %zu: rc %d", i, rc);
        char where[64];
        snprintf(where, sizeof where, "bad.prof:%d:", cases[i].line);
        ck_assert_msg(strstr(logbuf, where) && strstr(logbuf, cases[i].expect), "case %zu: wanted '%s' and '%s' in: %s",
                      i, where, cases[i].expect, logbuf);
    }
    capture();
    dear_profile_t p = { 0 };
    ck_assert_int_eq(dear_prof_load(tmpfile_path("missing.prof"), &p), DEAR_ERR_IO);
    ck_assert(strstr(logbuf, "missing.prof") != NULL);
    uncapture();
    /* A shipped profile cut in the middle. */
    char src[512];
    snprintf(src, sizeof src, "%s/fusion/profiles/resnet50.prof", DEAR_SRCDIR);
    FILE *in = fopen(src, "r");
    ck_assert_ptr_nonnull(in);
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, in);
    fclose(in);
    buf[n / 2] = '\0';
    write_file(path, buf);
    free(buf);
    capture();
    ck_assert_int_eq(dear_prof_load(path, &p), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(logbuf, "bad.prof:") != NULL, "%s", logbuf);
    uncapture();
}
END_TEST

/* ---- simulator vs hand-computed timelines ----
 * Three layers, forward 1 s each, backward 2 s each; one tensor per layer of b0, b1, b2 bytes
 * (hand_prof: 100, 200, 300). All-reduce 1 + 0.01 s/B; reduce-scatter and all-gather
 * 0.5 + 0.005 s/B. */
static void hand_prof_bytes(dear_profile_t *p, size_t b0, size_t b1, size_t b2)
{
    double fw[3] = { 1, 1, 1 }, bw[3] = { 2, 2, 2 };
    int lay[3] = { 0, 1, 2 };
    size_t by[3] = { b0, b1, b2 };
    make_prof(p, 3, fw, bw, 3, lay, by);
}

static void hand_prof(dear_profile_t *p) { hand_prof_bytes(p, 100, 200, 300); }

/* One bucket and one all-gather group per tensor of a hand profile, the last group early. */
static void hand_plan_early(dear_plan_t *pl)
{
    int none[4] = { 0, 1, 2, 3 };
    plan2(pl, 3, 3, none, 3, none);
    pl->ag_early = 1;
}

static const dear_sim_op_t *find_op(const dear_sim_result_t *r, int k, int index)
{
    for (int i = 0; i < r->nops; i++)
        if (r->ops[i].kind == k && r->ops[i].index == index)
            return &r->ops[i];
    ck_abort_msg("op %d/%d not recorded", (int)k, index);
    return NULL;
}

START_TEST(sim_sync_and_wfbp_by_hand)
{
    dear_profile_t p;
    hand_prof(&p);
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005);
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    int none[4] = { 0, 1, 2, 3 }, one[2] = { 0, 3 }, split[3] = { 0, 1, 3 };
    dear_plan_t pn, po, ps;
    plan2(&pn, 3, 3, none, 3, none);
    plan2(&po, 3, 1, one, 1, one);
    plan2(&ps, 3, 2, split, 2, split);
    dear_sim_result_t r = { 0 };
    /* sync: 3 + 6 + all-reduce of 600 bytes (7) = 16. */
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_SYNC, &pn, 1, &r), DEAR_OK);
    EQ(r.iter_s, 16);
    EQ(r.exposed_s, 7);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 0)->start, 9);
    /* wfbp, one bucket per layer: backward 3..9, grads ready at 5, 7, 9; AR 300 B 5..9,
     * 200 B 9..12, 100 B 12..14. */
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_WFBP, &pn, 1, &r), DEAR_OK);
    EQ(r.iter_s, 14);
    EQ(r.exposed_s, 5);
    EQ(r.comm_s, 9);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 2)->start, 5);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 1)->start, 9);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 0)->end, 14);
    EQ(find_op(&r, DEAR_SIM_BWD, 0)->start, 7);
    /* one bucket: ready at 9, 7 s: 16. Buckets {0} and {1,2}: {1,2} ready 7, 6 s -> 13; {0} 13..15. */
    EQ(sim_T(&p, &c, DEAR_SCHED_WFBP, &po), 16);
    EQ(sim_T(&p, &c, DEAR_SCHED_WFBP, &ps), 15);
    dear_sim_result_free(&r);
    dear_plan_free(&pn);
    dear_plan_free(&po);
    dear_plan_free(&ps);
    dear_prof_free(&p);
}
END_TEST

START_TEST(sim_dear_by_hand)
{
    dear_profile_t p;
    hand_prof(&p);
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005);
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    int none[4] = { 0, 1, 2, 3 }, one[2] = { 0, 3 };
    dear_plan_t pn, pm;
    plan2(&pn, 3, 3, none, 3, none);
    plan2(&pm, 3, 1, one, 3, none);
    dear_sim_result_t r = { 0 };
    /* Steady state, per layer buckets and groups. The previous iteration's reduce-scatter of
     * tensor 0 (1 s) ends 1 s into this forward, so: AG0 1..2, fwd0 2..3, AG1 2..3.5,
     * fwd1 3.5..4.5, AG2 3.5..5.5, fwd2 5.5..6.5; backward 6.5..12.5 (grads at 8.5, 10.5, 12.5);
     * RS2 8.5..10.5, RS1 10.5..12, RS0 12.5..13.5 = 1 s past the iteration end 12.5. */
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_DEAR, &pn, 1, &r), DEAR_OK);
    EQ(r.iter_s, 12.5);
    EQ(r.exposed_s, 3.5);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 0)->start, 1);
    EQ(find_op(&r, DEAR_SIM_FWD, 0)->start, 2);
    EQ(find_op(&r, DEAR_SIM_FWD, 1)->start, 3.5);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->end, 5.5);
    EQ(find_op(&r, DEAR_SIM_FWD, 2)->end, 6.5);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 2)->start, 8.5);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 1)->end, 12);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 0)->start, 12.5);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 0)->end, 13.5);
    /* One reduce-scatter bucket (600 B, 3.5 s) ready at the end of backward: tail 3.5 s; the
     * all-gathers then end at 4.5, 6, 8 against needs 0, 1, 2 (stall 6): 9 + 6 = 15. */
    EQ(sim_T(&p, &c, DEAR_SCHED_DEAR, &pm), 15);
    dear_sim_result_free(&r);
    dear_plan_free(&pn);
    dear_plan_free(&pm);
    dear_prof_free(&p);
}
END_TEST

/* The last all-gather group early: it follows its bucket's reduce-scatter during backward and
 * is done before the next forward needs it; the channel tail it leaves delays the others. */
START_TEST(sim_dear_early_by_hand)
{
    dear_profile_t p;
    hand_prof(&p);
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005); /* RS/AG of 100, 200, 300 B: 1, 1.5, 2 s */
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    dear_plan_t pl;
    hand_plan_early(&pl);
    /* Steady state: backward runs fw..fw+6 with gradients at fw+2, +4, +6. RS2 fw+2..+4, early
     * AG2 fw+4..+6, RS1 (ready +4) fw+6..+7.5, RS0 (ready +6) fw+7.5..+8.5: tail c0 = 2.5, AG2
     * ends at the iteration's end. Forward: AG0 2.5..3.5, fwd0 3.5..4.5, AG1 3.5..5, fwd1 5..6,
     * fwd2 (AG2 done) 6..7; iteration 7 + 6 = 13 (12.5 with every group in the forward). */
    dear_sim_result_t r = { 0 };
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_DEAR, &pl, 1, &r), DEAR_OK);
    EQ(r.iter_s, 13);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 0)->start, 2.5);
    EQ(find_op(&r, DEAR_SIM_FWD, 1)->start, 5);
    EQ(find_op(&r, DEAR_SIM_FWD, 2)->start, 6);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 2)->start, 9);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->start, 11);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->end, 13);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 1)->start, 13);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 0)->end, 15.5);
    EQ(r.comm_s, 1 + 1.5 + 2 + 2 + 1.5 + 1);
    /* A plan with more early groups than groups is refused. */
    pl.ag_early = 4;
    ck_assert_int_ne(dear_sim_run(&p, &c, DEAR_SCHED_DEAR, &pl, 0, &r), DEAR_OK);
    dear_sim_result_free(&r);
    dear_plan_free(&pl);
    dear_prof_free(&p);
}
END_TEST

/* Sharded slices stepped during backward (DEAR_SIM_SHARD_EARLY): the early group waits for the
 * hook that steps its bucket, in the runtime's sequence behind the next bucket's reduce-scatter
 * and ahead of the one after, and backward_end waits for the last reduce-scatter. With a long
 * last bucket and a short next one the channel idles until that hook. */
START_TEST(sim_dear_early_stepped_by_hand)
{
    dear_profile_t p;
    hand_prof_bytes(&p, 100, 20, 420);
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005); /* RS/AG: 1, 0.6, 2.6 s */
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    int none[4] = { 0, 1, 2, 3 };
    dear_plan_t pl;
    hand_plan_early(&pl);
    /* Hooks at fw+2, +4, +6. RS2 fw+2..+4.6, RS1 (ready +4) +4.6..+5.2; RS0, queued at the hook
     * of +6, waits behind AG2, which that hook's step of bucket 2 releases: AG2 +6..+8.6, RS0
     * +8.6..+9.6; backward_end steps bucket 0 once RS0 ends, so the next forward starts at
     * fw+9.6 on a free channel: AG0 0..1, AG1 1..1.6, fwd 1..4; iteration 4 + 9.6 = 13.6.
     * Behind its own bucket, unsharded: AG2 +4.6..+7.2, RS1 +7.2..+7.8, RS0 +7.8..+8.8,
     * c0 = 2.8, forward 6.8, iteration 12.8. */
    dear_sim_result_t r = { 0 };
    ck_assert_int_eq(dear_sim_run_ex(&p, &c, DEAR_SCHED_DEAR, &pl, DEAR_SIM_SHARD_EARLY, 1, &r), DEAR_OK);
    EQ(r.iter_s, 13.6);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 2)->start, 6);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 1)->start, 8.6);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->start, 10);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->end, 12.6);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 0)->start, 12.6);
    EQ(find_op(&r, DEAR_SIM_FWD, 2)->start, 3);
    double stepped = r.iter_s;
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_DEAR, &pl, 1, &r), DEAR_OK);
    EQ(r.iter_s, 12.8);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->start, 6.8 + 4.6);
    /* The planners' fast path prices it the same. */
    dear_sim_ws_t *ws;
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 1), 12.8);
    dear_sim_ws_set_shard(ws, DEAR_SIM_SHARD_EARLY);
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 1), stepped);
    /* Without early groups free steps price alike wherever they run: backward_end waits for RS0
     * (+6..+7), AG0..AG2 run 0..4.2, fwd2 4.2..5.2: 5.2 + 7. */
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 0), 12.2);
    dear_sim_ws_set_shard(ws, DEAR_SIM_SHARD_END);
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 0), 12.2);
    dear_sim_ws_free(ws);
    dear_sim_result_free(&r);
    dear_plan_free(&pl);
    dear_prof_free(&p);
}
END_TEST

/* Sharded steps that take time (profile step_s, 0.4 s a bucket): a step at a hook delays the
 * rest of backward, an early group leaves when its step ends, and backward_end steps the rest
 * once their reduce-scatters end; without early steps every step waits for backward_end. */
START_TEST(sim_dear_sharded_steps_by_hand)
{
    dear_profile_t p;
    hand_prof_bytes(&p, 100, 20, 100);
    for (int t = 0; t < 3; t++)
        p.tensors[t].step_s = 0.4;
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005); /* RS/AG: 1, 0.6, 1 s */
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    int none[4] = { 0, 1, 2, 3 };
    dear_plan_t pl;
    hand_plan_early(&pl);
    /* Backward from fw = 4: RS2 +2..+3; the hook of +4 queues RS1 (+4..+4.6), steps bucket 2
     * (+4..+4.4: AG2 +4.6..+5.6) and delays layer 0 to +4.4..+6.4; its hook queues RS0
     * (+6.4..+7.4) and steps bucket 1 (+6.4..+6.8); backward_end steps bucket 0 at +7.4..+7.8.
     * The channel idles 0.4 before the forward: AG0 0..1, AG1 1..1.6, fwd 1..4; iteration
     * 4 + 7.8 = 11.8, compute 3 + 6 + 1.2. */
    dear_sim_result_t r = { 0 };
    ck_assert_int_eq(dear_sim_run_ex(&p, &c, DEAR_SCHED_DEAR, &pl, DEAR_SIM_SHARD_EARLY, 1, &r), DEAR_OK);
    EQ(r.iter_s, 11.8);
    EQ(r.compute_s, 10.2);
    EQ(find_op(&r, DEAR_SIM_STEP, 2)->start, 8);
    EQ(find_op(&r, DEAR_SIM_BWD, 0)->start, 8.4);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->start, 8.6);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 0)->start, 10.4);
    EQ(find_op(&r, DEAR_SIM_STEP, 1)->start, 10.4);
    EQ(find_op(&r, DEAR_SIM_STEP, 0)->start, 11.4);
    EQ(find_op(&r, DEAR_SIM_FWD, 0)->start, 1);
    double early = r.iter_s;
    /* No early group, every step at backward_end (+6): bucket 2 +6..+6.4, 1 +6.4..+6.8, 0 after
     * RS0 (+6..+7) at +7..+7.4; AG0 0..1, AG1 1..1.6, AG2 1.6..2.6, fwd 1..4: 4 + 7.4. */
    pl.ag_early = 0;
    ck_assert_int_eq(dear_sim_run_ex(&p, &c, DEAR_SCHED_DEAR, &pl, DEAR_SIM_SHARD_END, 1, &r), DEAR_OK);
    EQ(r.iter_s, 11.4);
    EQ(find_op(&r, DEAR_SIM_STEP, 0)->start, 11);
    EQ(find_op(&r, DEAR_SIM_BWD, 0)->start, 8);
    /* The planners' fast path reads the steps from the profile too. */
    dear_sim_ws_t *ws;
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 0), 11.4);
    dear_sim_ws_set_shard(ws, DEAR_SIM_SHARD_EARLY);
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 1), early);
    dear_sim_ws_free(ws);
    /* Units carry their share of a tensor's step. */
    dear_unit_t u[4] = { { .tensor = 0, .offset = 0, .bytes = 100 }, { .tensor = 1, .offset = 0, .bytes = 20 },
                         { .tensor = 2, .offset = 0, .bytes = 25 }, { .tensor = 2, .offset = 25, .bytes = 75 } };
    dear_profile_t up = { 0 };
    ck_assert_int_eq(dear_prof_units(&p, 4, u, &up), DEAR_OK);
    EQ(up.tensors[2].step_s, 0.1);
    EQ(up.tensors[3].step_s, 0.3);
    dear_prof_free(&up);
    dear_sim_result_free(&r);
    dear_plan_free(&pl);
    dear_prof_free(&p);
}
END_TEST

/* The hand profile with tensor 2 (300 B) sparse in blocks of 30 B, 20% of them non-zero on a
 * rank and 50% in the sum: 6 blocks of 34 B (68 B) in reduce-scatter, 15 (170 B) in all-gather;
 * reduce-scatter of 68 B 0.84 s, all-gather of 170 B 1.35 s. */
START_TEST(sim_sparse_by_hand)
{
    dear_profile_t p;
    hand_prof(&p);
    p.tensors[2].block_bytes = 30;
    p.tensors[2].density_rs = 0.2;
    p.tensors[2].density_ag = 0.5;
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005);
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    dear_sim_ws_t *ws;
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    /* A group spanning dense and sparse tensors is two collectives, each paying its start-up. */
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_REDUCE_SCATTER, 2, 3), 0.84);
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_ALLGATHER, 2, 3), 1.35);
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_REDUCE_SCATTER, 0, 3), 0.5 + 0.005 * 300 + 0.84);
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_ALLGATHER, 1, 3), 0.5 + 0.005 * 200 + 1.35);
    /* A sparse all-reduce is its reduce-scatter then its all-gather. */
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_ALLREDUCE, 2, 3), 0.84 + 1.35);
    EQ(dear_sim_ws_bytes(ws, 0, 3), 600);
    /* With 2 ranks per host the reduce-scatter's 68 B cost what 136 B of the dense collective
     * cost; with 3, 204 B; with 5, 340 B would be more than its 300 dense bytes, which it then
     * costs (the runtime runs the dense algorithm). The all-gather crosses once per host: its
     * 170 B cost their own price at any spread. Dense tensors keep their price. */
    dear_sim_cost_t c2 = c, c3 = c, c5 = c;
    c2.spread = 2;
    c3.spread = 3;
    c5.spread = 5;
    EQ(dear_sim_ws_group(ws, &c5, DEAR_COLL_REDUCE_SCATTER, 2, 3), 0.5 + 0.005 * 300);
    EQ(dear_sim_ws_group(ws, &c5, DEAR_COLL_ALLGATHER, 2, 3), 1.35);
    EQ(dear_sim_ws_group(ws, &c2, DEAR_COLL_REDUCE_SCATTER, 2, 3), 0.5 + 0.005 * 136);
    EQ(dear_sim_ws_group(ws, &c2, DEAR_COLL_ALLGATHER, 2, 3), 1.35);
    EQ(dear_sim_ws_group(ws, &c2, DEAR_COLL_ALLREDUCE, 2, 3), 0.5 + 0.005 * 136 + 1.35);
    EQ(dear_sim_ws_group(ws, &c3, DEAR_COLL_REDUCE_SCATTER, 2, 3), 0.5 + 0.005 * 204);
    EQ(dear_sim_ws_group(ws, &c3, DEAR_COLL_ALLGATHER, 2, 3), 1.35);
    EQ(dear_sim_ws_group(ws, &c3, DEAR_COLL_REDUCE_SCATTER, 0, 3), 0.5 + 0.005 * 300 + 0.5 + 0.005 * 204);
    int none[4] = { 0, 1, 2, 3 };
    dear_plan_t pn;
    plan2(&pn, 3, 3, none, 3, none);
    /* sync: 9 + all-reduce of tensors 0-1 (300 B: 4 s) + the sparse all-reduce (2.19 s). */
    EQ(sim_T(&p, &c, DEAR_SCHED_SYNC, &pn), 9 + 4 + 2.19);
    /* wfbp, a bucket per layer: AR2 5..7.19, AR1 (3 s) 7.19..10.19, AR0 (2 s) 10.19..12.19. */
    EQ(sim_T(&p, &c, DEAR_SCHED_WFBP, &pn), 12.19);
    /* dear: as sim_dear_by_hand (12.5 s) but AG2 3.5..4.85, so forward 2 runs 4.85..5.85 and
     * backward 5.85..11.85; RS2 takes 0.84 s, RS0's tail is still 1 s: 11.85. */
    EQ(sim_T(&p, &c, DEAR_SCHED_DEAR, &pn), 11.85);
    dear_plan_free(&pn);
    dear_sim_ws_free(ws);
    dear_prof_free(&p);
}
END_TEST

/* A queued collective (ready while the channel is busy) costs its price times queued_fn, given
 * the group's dense bytes; one that finds the channel free, or ready just as it frees, its price. */
static double queued_double(void *arg, dear_coll_op_t op, size_t bytes)
{
    (void)arg;
    (void)op;
    (void)bytes;
    return 2;
}

static double queued_by_bytes(void *arg, dear_coll_op_t op, size_t bytes)
{
    (void)arg;
    (void)op;
    return 1 + (double)bytes / 1000;
}

/* The hand profile, the linear cost of the by-hand tests and one bucket and one all-gather group
 * per tensor. */
static void hand_per_tensor(dear_profile_t *p, lin_arg_t *l, dear_plan_t *pn)
{
    int none[4] = { 0, 1, 2, 3 };
    hand_prof(p);
    *l = lin(1, 0.01, 0.5, 0.005);
    plan2(pn, 3, 3, none, 3, none);
}

START_TEST(sim_queued_by_hand)
{
    dear_profile_t p;
    lin_arg_t l;
    dear_plan_t pn;
    int none[4] = { 0, 1, 2, 3 };
    hand_per_tensor(&p, &l, &pn);
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l, .queued_fn = queued_double };
    /* wfbp, one bucket per layer: AR 300 B ready at 5 on a free channel, 5..9; 200 B ready at
     * 7, queued: 2 x 3 s, 9..15; 100 B ready at 9, queued: 2 x 2 s, 15..19. */
    dear_sim_result_t r = { 0 };
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_WFBP, &pn, 1, &r), DEAR_OK);
    EQ(r.iter_s, 19);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 1)->end, 15);
    EQ(r.comm_s, 14);
    c.queued_fn = queued_by_bytes; /* 200 B: 1.2 x 3 s, 9..12.6; 100 B: 1.1 x 2 s, 12.6..14.8 */
    EQ(sim_T(&p, &c, DEAR_SCHED_WFBP, &pn), 14.8);
    /* A compressed collective keeps its price alone (no burst of it was measured): tensor 1 in
     * bf16 (100 B on the wire, 2 s) runs 9..11 though queued; tensor 0, float32, queued: 11..15. */
    dear_profile_t pc;
    hand_prof(&pc);
    dear_prof_set_compress(&pc, 1, DEAR_COMPRESS_BF16, DEAR_COMPRESS_BF16);
    c.queued_fn = queued_double;
    EQ(sim_T(&pc, &c, DEAR_SCHED_WFBP, &pn), 15);
    dear_prof_free(&pc);
    /* dear: RS2 13..15 and RS1 15..16.5 (ready as the channel frees: alone), RS0 17..18 (1 s
     * past the end); the next forward's all-gathers all queued (c0 = 1): AG0 1..3, fwd0 3..4,
     * AG1 3..6, fwd1 6..7, AG2 6..10, fwd2 10..11, backward 11..17. */
    c.queued_fn = queued_double;
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_DEAR, &pn, 1, &r), DEAR_OK);
    EQ(r.iter_s, 17);
    EQ(find_op(&r, DEAR_COLL_ALLGATHER, 2)->end, 10);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 1)->end, 16.5);
    /* The workspace path agrees. */
    dear_sim_ws_t *ws;
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 0), 17);
    c.queued_fn = NULL;
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 0), 12.5);
    dear_sim_ws_free(ws);
    dear_sim_result_free(&r);
    dear_plan_free(&pn);
    dear_prof_free(&p);
}
END_TEST

/* A collective ready after the channel was idle DEAR_COST_IDLE_GAP_S or more costs its price
 * times idle_fn; one ready as the channel frees, or queued, does not; the planners' group price
 * (dear_sim_ws_group) is the back-to-back one. */
static double idle_half(void *arg, dear_coll_op_t op, size_t bytes)
{
    (void)arg;
    (void)op;
    (void)bytes;
    return 0.5;
}

START_TEST(sim_idle_by_hand)
{
    dear_profile_t p;
    lin_arg_t l;
    dear_plan_t pn;
    int none[4] = { 0, 1, 2, 3 };
    hand_per_tensor(&p, &l, &pn);
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l, .idle_fn = idle_half };
    /* sync: the link idle through forward and backward (9 s): the 600 B all-reduce takes half of
     * its 7 s. */
    EQ(sim_T(&p, &c, DEAR_SCHED_SYNC, &pn), 9 + 3.5);
    /* wfbp, one bucket per layer: AR 300 B ready at 5 on a channel idle since 0: half of 4 s,
     * 5..7; 200 B ready at 7 as the channel frees: 3 s, 7..10; 100 B ready at 9, queued (no
     * queued_fn): 2 s, 10..12. */
    dear_sim_result_t r = { 0 };
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_WFBP, &pn, 1, &r), DEAR_OK);
    EQ(r.iter_s, 12);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 2)->end, 7);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 1)->end, 10);
    /* A compressed collective keeps its price: tensor 2 in bf16 (150 B on the wire, 2.5 s). */
    dear_profile_t pc;
    hand_prof(&pc);
    dear_prof_set_compress(&pc, 2, DEAR_COMPRESS_BF16, DEAR_COMPRESS_BF16);
    ck_assert_int_eq(dear_sim_run(&pc, &c, DEAR_SCHED_WFBP, &pn, 1, &r), DEAR_OK);
    EQ(find_op(&r, DEAR_COLL_ALLREDUCE, 2)->end, 7.5);
    dear_prof_free(&pc);
    /* dear: never slower than without the factor, and the workspace path agrees. */
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_DEAR, &pn, 1, &r), DEAR_OK);
    ck_assert(r.iter_s <= 12.5 + 1e-12);
    dear_sim_ws_t *ws;
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 0), r.iter_s);
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_ALLREDUCE, 2, 3), 4); /* tensor 2, 300 B: not halved */
    c.idle_fn = NULL;
    EQ(dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, 3, none, 3, none, 0), 12.5);
    EQ(sim_T(&p, &c, DEAR_SCHED_SYNC, &pn), 16);
    dear_sim_ws_free(ws);
    dear_sim_result_free(&r);
    dear_plan_free(&pn);
    dear_prof_free(&p);
}
END_TEST

/* Compressed tensors are priced at their wire bytes: with both phases in 16 bits every schedule
 * predicts what the same profile with half the bytes predicts; with the all-gathers in float32 an
 * all-reduce is a reduce-scatter of half the bytes and an all-gather of all; a tensor left
 * uncompressed is a collective of its own (the runtime cuts buckets where the type changes); a
 * sparse compressed tensor sends its non-zero blocks in 16 bits with 4-byte indices. */
START_TEST(sim_compress_by_hand)
{
    dear_profile_t p, half;
    hand_prof(&p);
    double fw[3] = { 1, 1, 1 }, bw[3] = { 2, 2, 2 };
    int lay[3] = { 0, 1, 2 };
    size_t by[3] = { 50, 100, 150 };
    make_prof(&half, 3, fw, bw, 3, lay, by);
    dear_prof_set_compress(&p, -1, DEAR_COMPRESS_BF16, DEAR_COMPRESS_BF16);
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005);
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    int none[4] = { 0, 1, 2, 3 }, one[2] = { 0, 3 };
    dear_plan_t pn, po;
    plan2(&pn, 3, 3, none, 3, none);
    plan2(&po, 3, 1, one, 1, one);
    for (int s = 0; s < DEAR_SCHED_COUNT; s++) {
        EQ(sim_T(&p, &c, (dear_sched_t)s, &pn), sim_T(&half, &c, (dear_sched_t)s, &pn));
        EQ(sim_T(&p, &c, (dear_sched_t)s, &po), sim_T(&half, &c, (dear_sched_t)s, &po));
    }
    dear_sim_ws_t *ws;
    dear_prof_set_compress(&p, -1, DEAR_COMPRESS_FP16, DEAR_COMPRESS_NONE);
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_ALLREDUCE, 0, 3), (0.5 + 0.005 * 300) + (0.5 + 0.005 * 600));
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_REDUCE_SCATTER, 0, 3), 0.5 + 0.005 * 300);
    dear_sim_ws_free(ws);
    dear_prof_set_compress(&p, 1, DEAR_COMPRESS_NONE, DEAR_COMPRESS_NONE);
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_ALLGATHER, 0, 3), 3 * 0.5 + 0.005 * 600);
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_REDUCE_SCATTER, 0, 3), 3 * 0.5 + 0.005 * (50 + 200 + 150));
    dear_sim_ws_free(ws);
    p.tensors[2].block_bytes = 30;
    p.tensors[2].density_rs = 0.2;
    dear_prof_set_compress(&p, 2, DEAR_COMPRESS_BF16, DEAR_COMPRESS_BF16);
    EQ(dear_prof_wire_bytes(&p.tensors[2], DEAR_COLL_REDUCE_SCATTER), 2 * (15 + 4));
    p.tensors[2].density_rs = 1;
    EQ(dear_prof_wire_bytes(&p.tensors[2], DEAR_COLL_REDUCE_SCATTER), 150);
    /* int8: a byte per value and a float32 scale per 256 values; each phase its own format */
    dear_prof_set_compress(&p, 0, DEAR_COMPRESS_INT8, DEAR_COMPRESS_NONE);
    double values = (double)p.tensors[0].bytes / sizeof(float);
    EQ(dear_prof_wire_bytes(&p.tensors[0], DEAR_COLL_REDUCE_SCATTER), values + values / 256 * sizeof(float));
    EQ(dear_prof_wire_bytes(&p.tensors[0], DEAR_COLL_ALLGATHER), (double)p.tensors[0].bytes);
    /* a sparse tensor's non-zero blocks under int8: a byte per value, a scale and an index per
     * block (blocks of 30 bytes, 7.5 values, below 256); dense when that is smaller */
    dear_prof_set_compress(&p, 2, DEAR_COMPRESS_INT8, DEAR_COMPRESS_INT8);
    p.tensors[2].density_rs = 0.2;
    EQ(dear_prof_wire_bytes(&p.tensors[2], DEAR_COLL_REDUCE_SCATTER), 0.2 * (75 + 300 / 30 * (4 + 4)));
    p.tensors[2].density_rs = 1;
    EQ(dear_prof_wire_bytes(&p.tensors[2], DEAR_COLL_REDUCE_SCATTER), 75 + 75.0 / 256 * 4);
    /* With a format cost, a dense compressed run is priced by it; float32 and sparse runs keep
     * the plain cost; an all-reduce whose halves travel alike is one collective in its format. */
    dear_sim_cost_t cf = { .fn = lin_cost, .arg = &l, .fmt_fn = fmt_cost };
    p.tensors[2].block_bytes = 0;
    dear_prof_set_compress(&p, -1, DEAR_COMPRESS_INT8, DEAR_COMPRESS_INT8);
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    double w3 = 150 + 150.0 / 256 * 4;
    EQ(dear_sim_ws_group(ws, &cf, DEAR_COLL_REDUCE_SCATTER, 0, 3), fmt_cost(NULL, DEAR_COLL_REDUCE_SCATTER, (size_t)llround(w3), DEAR_COMPRESS_INT8));
    EQ(dear_sim_ws_group(ws, &cf, DEAR_COLL_ALLREDUCE, 0, 3), fmt_cost(NULL, DEAR_COLL_ALLREDUCE, (size_t)llround(w3), DEAR_COMPRESS_INT8));
    EQ(dear_sim_ws_group(ws, &c, DEAR_COLL_REDUCE_SCATTER, 0, 3), 0.5 + 0.005 * (double)llround(w3));
    dear_sim_ws_free(ws);
    dear_prof_set_compress(&p, 0, DEAR_COMPRESS_NONE, DEAR_COMPRESS_NONE);
    p.tensors[2].block_bytes = 30;
    p.tensors[2].density_rs = 0.2;
    ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
    double sparse = 0.2 * (75 + 300 / 30 * (4 + 4)); /* int8 values, a scale and an index per block */
    EQ(dear_sim_ws_group(ws, &cf, DEAR_COLL_REDUCE_SCATTER, 0, 3),
       (0.5 + 0.005 * 100) + fmt_cost(NULL, DEAR_COLL_REDUCE_SCATTER, (size_t)llround(200 / 4.0 * (1 + 4.0 / 256)), DEAR_COMPRESS_INT8) +
           (0.5 + 0.005 * (double)llround(sparse)));
    /* int8 always runs the exchange: 4 ranks per host send 4 times its bytes, though they are
     * more than its 75 dense int8 bytes. */
    dear_sim_cost_t c4 = c;
    c4.spread = 4;
    ck_assert(4 * llround(sparse) > 75);
    EQ(dear_sim_ws_group(ws, &c4, DEAR_COLL_REDUCE_SCATTER, 2, 3), 0.5 + 0.005 * 4 * (double)llround(sparse));
    dear_sim_ws_free(ws);
    dear_plan_free(&pn);
    dear_plan_free(&po);
    dear_prof_free(&p);
    dear_prof_free(&half);
}
END_TEST

/* A layer without tensors, a layer whose two tensors sit in two all-gather groups, and a
 * trailing layer without tensors. */
START_TEST(sim_dear_layers_without_tensors)
{
    double fw[4] = { 1, 1, 1, 2 }, bw[4] = { 1, 1, 1, 1 };
    int lay[3] = { 1, 2, 2 };
    size_t by[3] = { 100, 100, 100 };
    dear_profile_t p;
    make_prof(&p, 4, fw, bw, 3, lay, by);
    lin_arg_t l = lin(1, 0.01, 1, 0.01);   /* RS/AG of 100 B: 2 s */
    dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
    int rs[2] = { 0, 3 }, ag[4] = { 0, 1, 2, 3 };
    dear_plan_t pl;
    plan2(&pl, 3, 1, rs, 3, ag);
    /* RS of all 300 B (4 s) ready when layer 1's backward ends, 3 s into backward (B = 4): tail
     * 3 s. AG: 3..5 (t0), 5..7 (t1), 7..9 (t2). Layer 0 0..1; layer 1 waits for t0: 5..6;
     * layer 2 waits for t2 (its two tensors span two groups): 9..10; layer 3 10..12. Iteration
     * 12 + 4 = 16; RS starts at 12 + 3 = 15, ends 19: tail 3 again. */
    dear_sim_result_t r = { 0 };
    ck_assert_int_eq(dear_sim_run(&p, &c, DEAR_SCHED_DEAR, &pl, 1, &r), DEAR_OK);
    EQ(r.iter_s, 16);
    EQ(find_op(&r, DEAR_SIM_FWD, 0)->start, 0);
    EQ(find_op(&r, DEAR_SIM_FWD, 1)->start, 5);
    EQ(find_op(&r, DEAR_SIM_FWD, 2)->start, 9);
    EQ(find_op(&r, DEAR_COLL_REDUCE_SCATTER, 0)->end, 19);
    /* SVG renders. */
    FILE *f = fopen(tmpfile_path("g.svg"), "w");
    ck_assert_int_eq(dear_sim_svg(&r, "test <&>", f), DEAR_OK);
    fclose(f);
    dear_sim_result_free(&r);
    dear_plan_free(&pl);
    dear_prof_free(&p);
}
END_TEST

/* ---- MG-WFBP, hand-worked ----
 * Same model as hand_prof, all-reduce a = 1, b = 0.01, ready times (after backward start)
 * t2: 2, t1: 4, t0: 6. Group {t2} would start at 2; t1 is ready at 4 >= 2 + a, so {t2} is
 * closed (ends 2 + 4 = 6) and {t1} starts at max(6, 4) = 6; t0 is ready at 6 < 6 + a, so it
 * joins: buckets {t0, t1} and {t2}. Simulated: {t2} 5..9, {t0,t1} 9..13 -> 13 (none: 14). */
START_TEST(mgwfbp_hand_worked)
{
    dear_profile_t p;
    hand_prof(&p);
    lin_arg_t l = lin(1, 0.01, 0.5, 0.005);
    dear_plan_problem_t prob;
    problem_linear(&prob, &p, DEAR_SCHED_WFBP, &l);
    dear_plan_t plan = { 0 };
    ck_assert_int_eq(dear_plan_mgwfbp(&plan, &prob), DEAR_OK);
    ck_assert_int_eq(plan.rs.ngroups, 2);
    ck_assert_int_eq(plan.rs.first[0], 0);
    ck_assert_int_eq(plan.rs.first[1], 2);
    ck_assert_int_eq(plan.rs.first[2], 3);
    ck_assert(dear_plan_equal(&(dear_plan_t){ .nunits = 3, .ntensors = 3, .rs = plan.rs, .ag = plan.rs }, &plan));
    EQ(sim_T(&p, &prob.cost, DEAR_SCHED_WFBP, &plan), 13);
    /* With a = 3 everything merges: t1 ready 4 < 2 + 3; then s = 4 and t0 ready 6 < 4 + 3. */
    l = lin(3, 0.01, 1.5, 0.005);
    problem_linear(&prob, &p, DEAR_SCHED_WFBP, &l);
    ck_assert_int_eq(dear_plan_mgwfbp(&plan, &prob), DEAR_OK);
    ck_assert_int_eq(plan.rs.ngroups, 1);
    dear_plan_free(&plan);
    dear_prof_free(&p);
}
END_TEST

/* ---- DP vs brute force ---- */

static uint64_t tseed = 12345;
static double urand(void)
{
    tseed = tseed * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(tseed >> 11) * 0x1.0p-53;
}

static void random_instance(dear_profile_t *p, int n, lin_arg_t *l)
{
    double fw[400], bw[400];
    int lay[128] = { 0 };
    size_t by[128] = { 0 };
    int nl = 0;
    ck_assert(n <= 128);
    if (urand() < 0.3) {   /* a leading layer without tensors */
        fw[nl] = 0.1 + urand();
        bw[nl] = 0.1 + urand();
        nl++;
    }
    for (int t = 0; t < n; t++) {
        if (t == 0 || urand() > 0.3) {
            fw[nl] = 0.05 + urand();
            bw[nl] = 0.1 + 2 * urand();
            nl++;
            if (urand() < 0.15) {   /* and some in the middle */
                fw[nl] = 0.05 + urand();
                bw[nl] = 0.1 + urand();
                nl++;
                fw[nl] = 0.05 + urand();
                bw[nl] = 0.1 + urand();
                nl++;
            }
        }
        lay[t] = nl - 1;
        by[t] = 1 + (size_t)(1000 * urand());
    }
    make_prof(p, nl, fw, bw, n, lay, by);
    /* Some tensors sparse, so the DPs are exact under the runs' cuts and wire bytes too. */
    for (int t = 0; t < n; t++) {
        if (urand() >= 0.25)
            continue;
        size_t k = 1 + (size_t)(4 * urand());
        p->tensors[t].block_bytes = by[t] % k == 0 ? by[t] / k : by[t];
        p->tensors[t].density_rs = urand();
        p->tensors[t].density_ag = urand();
    }
    double a = 0.02 + 0.8 * urand(), b = 1e-4 + 3e-3 * urand();
    *l = lin(a, b, a * (0.3 + 0.4 * urand()), b * (0.3 + 0.4 * urand()));
}

static void partition_from_mask(unsigned mask, int n, int *first, int *ng)
{
    int k = 0;
    first[k++] = 0;
    for (int i = 0; i < n - 1; i++)
        if (mask & (1u << i))
            first[k++] = i + 1;
    first[k] = n;
    *ng = k;
}

/* Units of tensors d[0..k) at partition bytes. */
static int units_at(int k, const dear_tensor_desc_t *d, size_t partition)
{
    dear_unit_t *u = NULL;
    int nu = 0;
    ck_assert_int_eq(dear_units_cut(k, d, partition, &u, &nu), DEAR_OK);
    free(u);
    return nu;
}

/* A random instance of n units (2 <= n) cut by dear_units_cut from fewer tensors, so at least one
 * tensor is in several chunks, which share its layer and ready time; sparse ones are cut on rows.
 * The partition is found by bisection (units never increase as it grows). */
static void chunked_instance(dear_profile_t *p, int n, lin_arg_t *l)
{
    for (;;) {
        dear_profile_t t;
        int k = 1 + (int)(urand() * (n - 1));
        random_instance(&t, k, l);
        size_t most = 0;
        for (int i = 0; i < k; i++) {
            t.tensors[i].bytes *= DEAR_UNIT_ALIGN;
            t.tensors[i].block_bytes *= DEAR_UNIT_ALIGN;
            most = t.tensors[i].bytes > most ? t.tensors[i].bytes : most;
        }
        dear_tensor_desc_t *d;
        ck_assert_int_eq(dear_prof_descs(&t, &d), DEAR_OK);
        size_t lo = 1, hi = most;   /* units(lo) >= n > units(hi) = k, unless none reaches n */
        if (units_at(k, d, lo) >= n) {
            while (hi - lo > 1) {
                size_t mid = lo + (hi - lo) / 2;
                *(units_at(k, d, mid) >= n ? &lo : &hi) = mid;
            }
            dear_unit_t *u = NULL;
            int nu = 0;
            ck_assert_int_eq(dear_units_cut(k, d, lo, &u, &nu), DEAR_OK);
            if (nu == n) {
                memset(p, 0, sizeof *p);
                ck_assert_int_eq(dear_prof_units(&t, nu, u, p), DEAR_OK);
                free(u);
                free(d);
                dear_prof_free(&t);
                return;
            }
            free(u);
        }
        free(d);
        dear_prof_free(&t);
    }
}

/* Instances inst >= plain are cut into chunks. */
static void any_instance(dear_profile_t *p, int n, lin_arg_t *l, int inst, int plain)
{
    if (inst < plain)
        random_instance(p, n, l);
    else
        chunked_instance(p, n, l);
}

START_TEST(dp_equals_brute_force)
{
    dear_sim_ws_t *ws;
    for (int inst = 0; inst < 180; inst++) {
        int n = 2 + inst % 13;   /* 2..14 tensors, from 120 on units of fewer tensors */
        dear_profile_t p;
        lin_arg_t l;
        any_instance(&p, n, &l, inst, 120);
        dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
        ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
        int rs[16], ag[16], nrs, nag;
        /* wfbp: brute force over all-reduce bucketings. */
        dear_plan_problem_t prob;
        problem_linear(&prob, &p, DEAR_SCHED_WFBP, &l);
        dear_plan_t dp = { 0 };
        ck_assert_int_eq(dear_plan_dp(&dp, &prob), DEAR_OK);
        double best = INFINITY;
        for (unsigned m = 0; m < (1u << (n - 1)); m++) {
            partition_from_mask(m, n, rs, &nrs);
            double t = dear_sim_ws_iter(ws, &c, DEAR_SCHED_WFBP, nrs, rs, nrs, rs, 0);
            best = t < best ? t : best;
        }
        double tdp = sim_T(&p, &c, DEAR_SCHED_WFBP, &dp);
        ck_assert_msg(fabs(tdp - best) <= 1e-9 * best, "wfbp instance %d (n=%d): dp %.12g, brute force %.12g", inst,
                      n, tdp, best);
        /* dear, every all-gather in the forward pass (split n): the reduce-scatter phase,
         * all-gathers one group per tensor. */
        problem_linear(&prob, &p, DEAR_SCHED_DEAR, &l);
        ck_assert_int_eq(dear_plan_dp_split(&dp, &prob, n), DEAR_OK);
        ck_assert_int_eq(dp.ag_early, 0);
        partition_from_mask((1u << (n - 1)) - 1, n, ag, &nag);
        best = INFINITY;
        for (unsigned m = 0; m < (1u << (n - 1)); m++) {
            partition_from_mask(m, n, rs, &nrs);
            double t = dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, nrs, rs, nag, ag, 0);
            best = t < best ? t : best;
        }
        double tdp_rs = dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, dp.rs.ngroups, dp.rs.first, nag, ag, 0);
        ck_assert_msg(fabs(tdp_rs - best) <= 1e-9 * best, "dear rs instance %d (n=%d): dp %.12g, brute %.12g", inst,
                      n, tdp_rs, best);
        /* dear: the all-gather phase with the DP's reduce-scatter buckets. */
        best = INFINITY;
        for (unsigned m = 0; m < (1u << (n - 1)); m++) {
            partition_from_mask(m, n, ag, &nag);
            double t = dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, dp.rs.ngroups, dp.rs.first, nag, ag, 0);
            best = t < best ? t : best;
        }
        tdp = sim_T(&p, &c, DEAR_SCHED_DEAR, &dp);
        ck_assert_msg(fabs(tdp - best) <= 1e-9 * best, "dear ag instance %d (n=%d): dp %.12g, brute %.12g", inst, n,
                      tdp, best);
        /* A bucket memory cap: the DP over admissible groups equals brute force over the
         * partitions whose groups all fit (both phases, dear). */
        size_t maxb = 0, tot = 0;
        for (int t = 0; t < n; t++) {
            maxb = p.tensors[t].bytes > maxb ? p.tensors[t].bytes : maxb;
            tot += p.tensors[t].bytes;
        }
        prob.cap_bytes = maxb + (size_t)((double)(tot - maxb) * 0.4 * urand());
        ck_assert_int_eq(dear_plan_dp_split(&dp, &prob, n), DEAR_OK);
        double best_rs = INFINITY, best_ag = INFINITY;
        for (unsigned m = 0; m < (1u << (n - 1)); m++) {
            partition_from_mask(m, n, rs, &nrs);
            int fits = 1;
            for (int g = 0; g < nrs && fits; g++) {
                size_t b = 0;
                for (int t = rs[g]; t < rs[g + 1]; t++)
                    b += p.tensors[t].bytes;
                fits = b <= prob.cap_bytes;
            }
            if (!fits)
                continue;
            double t1 = dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, nrs, rs, dp.ag.ngroups, dp.ag.first, 0);
            double t2 = dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, dp.rs.ngroups, dp.rs.first, nrs, rs, 0);
            best_rs = t1 < best_rs ? t1 : best_rs;
            best_ag = t2 < best_ag ? t2 : best_ag;
        }
        double tcap = sim_T(&p, &c, DEAR_SCHED_DEAR, &dp);
        ck_assert_msg(fabs(tcap - best_rs) <= 1e-9 * best_rs && fabs(tcap - best_ag) <= 1e-9 * best_ag,
                      "capped instance %d: dp %.12g, brute rs %.12g ag %.12g", inst, tcap, best_rs, best_ag);
        for (int g = 0; g < dp.rs.ngroups; g++) {
            size_t b = 0;
            for (int t = dp.rs.first[g]; t < dp.rs.first[g + 1]; t++)
                b += p.tensors[t].bytes;
            ck_assert(b <= prob.cap_bytes);
        }
        prob.cap_bytes = 0;
        ck_assert_int_eq(dear_plan_dp_split(&dp, &prob, n), DEAR_OK);
        /* Both phases jointly, small n. */
        if (n <= 7) {
            best = INFINITY;
            for (unsigned m1 = 0; m1 < (1u << (n - 1)); m1++)
                for (unsigned m2 = 0; m2 < (1u << (n - 1)); m2++) {
                    partition_from_mask(m1, n, rs, &nrs);
                    partition_from_mask(m2, n, ag, &nag);
                    double t = dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, nrs, rs, nag, ag, 0);
                    best = t < best ? t : best;
                }
            ck_assert_msg(fabs(tdp - best) <= 1e-9 * best, "dear joint instance %d: dp %.12g, brute %.12g", inst, tdp,
                          best);
        }
        dear_plan_free(&dp);
        dear_sim_ws_free(ws);
        dear_prof_free(&p);
    }
}
END_TEST

/* dp with a split m: the bucket DP (each bucket's part past m gathered right behind it) and the
 * group DP over [0, m) give the best plan of that family, against brute force over both
 * partitions; dear_plan_dp is the best split, never worse than no early group. */
START_TEST(dp_split_equals_brute_force)
{
    int wins = 0;
    for (int inst = 0; inst < 90; inst++) {
        int n = 2 + inst % 6;   /* 2..7 tensors, from 60 on units of fewer tensors */
        dear_profile_t p;
        lin_arg_t l;
        any_instance(&p, n, &l, inst, 60);
        if (inst % 2) /* backward-heavy: the link idles in backward, early groups pay */
            for (int i = 0; i < p.nlayers; i++)
                p.layers[i].bwd_s *= 3;
        dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
        dear_sim_ws_t *ws;
        ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
        dear_plan_problem_t prob;
        problem_linear(&prob, &p, DEAR_SCHED_DEAR, &l);
        double best_all = INFINITY, t_none = INFINITY;
        for (int m = 0; m <= n; m++) {
            dear_plan_t dp = { 0 };
            ck_assert_int_eq(dear_plan_dp_split(&dp, &prob, m), DEAR_OK);
            double tdp = sim_T(&p, &c, DEAR_SCHED_DEAR, &dp);
            ck_assert_int_eq(dp.ag.first[dp.ag.ngroups - dp.ag_early], m < n ? m : n);
            /* Brute force: buckets (any), regular groups over [0, m) (any), early groups = the
             * buckets cut at m. */
            double best = INFINITY;
            int rs[16], ag[18], nrs, nreg;
            for (unsigned a = 0; a < (1u << (n - 1)); a++) {
                partition_from_mask(a, n, rs, &nrs);
                unsigned nmask = m > 1 ? (1u << (m - 1)) : 1;
                for (unsigned b = 0; b < nmask; b++) {
                    int k = 0;
                    if (m > 0) {
                        partition_from_mask(b, m, ag, &nreg);
                        k = nreg;
                    }
                    int reg = k;
                    if (m < n) {
                        ag[k++] = m;
                        for (int g = 1; g < nrs; g++)
                            if (rs[g] > m)
                                ag[k++] = rs[g];
                    }
                    ag[k] = n;
                    double t = dear_sim_ws_iter(ws, &c, DEAR_SCHED_DEAR, nrs, rs, k, ag, k - reg);
                    best = t < best ? t : best;
                }
            }
            ck_assert_msg(fabs(tdp - best) <= 1e-9 * best, "instance %d (n=%d) split %d: dp %.12g, brute %.12g",
                          inst, n, m, tdp, best);
            /* dp's candidate splits: between layers and between the chunks of a tensor */
            int between = m == 0 || m == n || p.tensors[m].lidx != p.tensors[m - 1].lidx || p.tensors[m].chunk > 0;
            if (between)
                best_all = tdp < best_all ? tdp : best_all;
            if (m == n)
                t_none = tdp;
            dear_plan_free(&dp);
        }
        dear_plan_t dp = { 0 };
        ck_assert_int_eq(dear_plan_dp(&dp, &prob), DEAR_OK);
        double tdp = sim_T(&p, &c, DEAR_SCHED_DEAR, &dp);
        ck_assert_msg(fabs(tdp - best_all) <= 1e-9 * best_all, "instance %d: dp %.12g, best split %.12g", inst, tdp,
                      best_all);
        ck_assert(tdp <= t_none * (1 + 1e-12));
        wins += tdp < t_none * (1 - 1e-9);
        dear_plan_free(&dp);
        dear_sim_ws_free(ws);
        dear_prof_free(&p);
    }
    ck_assert_msg(wins >= 5, "early all-gathers won only %d of 90 instances", wins);
}
END_TEST

/* dp's search for the split reuses the groups it priced for one split at the others: on larger
 * instances (sparse runs and chunks included) its plan is still the best of the splits each
 * planned alone. */
START_TEST(dp_search_equals_best_split)
{
    for (int inst = 0; inst < 12; inst++) {
        int n = 30 + 7 * inst;
        dear_profile_t p;
        lin_arg_t l;
        any_instance(&p, n, &l, inst, 6);
        if (inst % 2)
            for (int i = 0; i < p.nlayers; i++)
                p.layers[i].bwd_s *= 3;
        /* The all-gathers priced apart from the reduce-scatters, so a group priced for one op
         * and read back for the other shows. */
        l.alpha[DEAR_COLL_ALLGATHER] *= 0.5 + urand();
        l.beta[DEAR_COLL_ALLGATHER] *= 0.5 + urand();
        dear_sim_cost_t c = { .fn = lin_cost, .arg = &l };
        dear_plan_problem_t prob;
        problem_linear(&prob, &p, DEAR_SCHED_DEAR, &l);
        double best = INFINITY;
        for (int m = 0; m <= n; m++) {
            if (!(m == 0 || m == n || p.tensors[m].lidx != p.tensors[m - 1].lidx || p.tensors[m].chunk > 0))
                continue;
            dear_plan_t one = { 0 };
            ck_assert_int_eq(dear_plan_dp_split(&one, &prob, m), DEAR_OK);
            double t = sim_T(&p, &c, DEAR_SCHED_DEAR, &one);
            best = t < best ? t : best;
            dear_plan_free(&one);
        }
        dear_plan_t dp = { 0 };
        ck_assert_int_eq(dear_plan_dp(&dp, &prob), DEAR_OK);
        double tdp = sim_T(&p, &c, DEAR_SCHED_DEAR, &dp);
        ck_assert_msg(fabs(tdp - best) <= 1e-9 * best, "instance %d (n=%d): dp %.12g, best split %.12g", inst, n,
                      tdp, best);
        dear_plan_free(&dp);
        dear_prof_free(&p);
    }
}
END_TEST

/* ---- GradSSA ---- */

static double plan_T(const dear_plan_problem_t *prob, const char *name, dear_plan_t *out)
{
    dear_plan_t pl = { 0 };
    ck_assert_int_eq(dear_plan_by_name(&pl, prob, name), DEAR_OK);
    double t = sim_T(prob->prof, &prob->cost, prob->sched, &pl);
    if (out) {
        dear_plan_free(out);
        *out = pl;
    } else {
        dear_plan_free(&pl);
    }
    return t;
}

/* A shipped profile. */
static void load_shipped(const char *model, dear_profile_t *p)
{
    char path[512];
    snprintf(path, sizeof path, "%s/fusion/profiles/%s.prof", DEAR_SRCDIR, model);
    *p = (dear_profile_t){ 0 };
    ck_assert_int_eq(dear_prof_load(path, p), DEAR_OK);
}

/* A shipped profile and the 10GbE preset for 64 ranks. */
static void shipped_10gbe(const char *model, dear_profile_t *p, dear_cost_model_t *m)
{
    load_shipped(model, p);
    ck_assert_int_eq(dear_cost_preset("10gbe", 64, 1, m), DEAR_OK);
}

/* The iteration of plan under prob's model with every collective s times dearer. */
static double sim_scaled(const dear_plan_problem_t *prob, const dear_plan_t *plan, double s)
{
    const dear_sim_model_arg_t *marg = prob->cost.arg;
    dear_cost_model_t m = *marg->model;
    dear_cost_mul(&m, s);
    dear_sim_model_arg_t ma = { .model = &m, .cap_bytes = marg->cap_bytes };
    dear_sim_cost_t c = prob->cost;
    c.arg = &ma;
    return sim_T(prob->prof, &c, prob->sched, plan);
}

/* dear_cost_mul makes every price s times dearer and keeps the ratios of the burst and idle
 * curves; the fit to a measured iteration finds the factor that made it, and only in [1, smax]. */
START_TEST(cost_fit_to_training)
{
    dear_cost_model_t m;
    memset(&m, 0, sizeof m);
    m.comm_size = 8;
    m.ranks_per_host = 4;
    dear_coll_op_t ar = DEAR_COLL_ALLREDUCE;
    const double MiB = 1 << 20;
    double xa[3] = { 65536, MiB, 4 * MiB }, ya[3] = { 1e-3, 0.1, 0.4 };
    double xi[3] = { MiB, 2 * MiB, 4 * MiB }, yi[3] = { 0.08, 0.16, 0.32 };
    double xb[2] = { 8192, 65536 }, yb[2] = { 2e-4, 6e-4 };
    ck_assert_int_eq(dear_cost_fit_curve(xa, ya, 3, &m.line[ar][DEAR_ALGO_AUTO]), DEAR_OK);
    ck_assert_int_eq(dear_cost_fit_curve(xi, yi, 3, &m.idle[ar]), DEAR_OK);
    ck_assert_int_eq(dear_cost_fit_curve(xb, yb, 2, &m.burst[ar]), DEAR_OK);
    m.burst_k = 4;
    dear_cost_model_t m2 = m;
    dear_cost_mul(&m2, 1.5);
    static const double sizes[] = { 4096, 65536, 3 * MiB, 16 * MiB };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        EQ(dear_cost_eval(&m2, ar, sizes[i], NULL), 1.5 * dear_cost_eval(&m, ar, sizes[i], NULL));
        EQ(dear_cost_idle_factor(&m2, ar, sizes[i]), dear_cost_idle_factor(&m, ar, sizes[i]));
        EQ(dear_cost_queued_factor(&m2, ar, sizes[i]), dear_cost_queued_factor(&m, ar, sizes[i]));
    }
    ck_assert(dear_cost_idle_factor(&m, ar, 3 * MiB) < 1 && dear_cost_queued_factor(&m, ar, 65536) != 1);
    ck_assert(!m2.line[DEAR_COLL_REDUCE_SCATTER][DEAR_ALGO_AUTO].valid); /* what had no data still has none */

    static const int scheds[2] = { DEAR_SCHED_WFBP, DEAR_SCHED_DEAR };
    for (int si = 0; si < 2; si++) {
        dear_profile_t p;
        dear_cost_model_t c;
        shipped_10gbe("resnet50", &p, &c);
        dear_cost_mul(&c, 4.0); /* communication about as long as compute: a slower link */
        dear_sim_model_arg_t marg;
        dear_plan_problem_t prob;
        ck_assert_int_eq(dear_plan_problem_init(&prob, &p, (dear_sched_t)scheds[si], &c, 0, &marg), DEAR_OK);
        dear_plan_t thr = { 0 }, dp = { 0 };
        double t1 = plan_T(&prob, "threshold", &thr);
        plan_T(&prob, "dp", &dp);
        double s = 0;
        /* training ran the threshold plan as a model 1.3 times dearer prices it */
        double measured = sim_scaled(&prob, &thr, 1.3);
        ck_assert_msg(measured > 1.02 * t1, "the case must expose communication: %g vs %g", measured, t1);
        ck_assert_int_eq(dear_sim_fit_scale(&p, &prob.cost, prob.sched, &thr, prob.shard, measured, 2.0, &s),
                         DEAR_OK);
        ck_assert_msg(fabs(s - 1.3) < 2e-3, "fitted %g, made with 1.3", s);
        /* the fitted model prices the other plan as the model that made the measurement does */
        ck_assert(fabs(sim_scaled(&prob, &dp, s) - sim_scaled(&prob, &dp, 1.3)) < 0.01 * sim_scaled(&prob, &dp, 1.3));
        /* faster than the model: never cheaper; beyond smax: smax */
        ck_assert_int_eq(dear_sim_fit_scale(&p, &prob.cost, prob.sched, &thr, prob.shard, 0.9 * t1, 2.0, &s), DEAR_OK);
        EQ(s, 1);
        ck_assert_int_eq(dear_sim_fit_scale(&p, &prob.cost, prob.sched, &thr, prob.shard, sim_scaled(&prob, &thr, 3),
                                            2.0, &s), DEAR_OK);
        EQ(s, 2.0);
        ck_assert_int_eq(dear_sim_fit_scale(&p, &prob.cost, prob.sched, &thr, prob.shard, 0, 2.0, &s), DEAR_ERR_ARG);
        ck_assert_int_eq(dear_sim_fit_scale(&p, &prob.cost, prob.sched, &thr, prob.shard, t1, 0.5, &s), DEAR_ERR_ARG);
        dear_plan_free(&thr);
        dear_plan_free(&dp);
        dear_prof_free(&p);
    }
}
END_TEST

START_TEST(gradssa_deterministic_and_never_worse)
{
    /* A non-linear cost: two algorithms crossing, and a cap on bucket memory. */
    dear_profile_t p;
    dear_cost_model_t m;
    shipped_10gbe("resnet50", &p, &m);
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        dear_cost_line_t r = m.line[op][DEAR_ALGO_RING];
        m.line[op][DEAR_ALGO_RHD] = (dear_cost_line_t){ .valid = 1, .alpha = r.alpha / 8, .beta = r.beta * 3 };
    }
    size_t cap = 16u << 20;   /* above the largest tensor (9.4 MB), below the 25 MiB threshold buckets */
    static const int scheds[2] = { DEAR_SCHED_WFBP, DEAR_SCHED_DEAR };
    for (int si = 0; si < 2; si++) {
        int s = scheds[si];
        dear_sim_model_arg_t marg;
        dear_plan_problem_t prob;
        ck_assert_int_eq(dear_plan_problem_init(&prob, &p, (dear_sched_t)s, &m, cap, &marg), DEAR_OK);
        prob.rounds = 60;
        prob.seed = 42;
        dear_plan_t a = { 0 }, b = { 0 };
        double ta = plan_T(&prob, "gradssa", &a);
        double tb = plan_T(&prob, "gradssa", &b);
        ck_assert(dear_plan_equal(&a, &b));
        EQ(ta, tb);
        double seeds = INFINITY;
        static const char *const names[] = { "none", "one", "mgwfbp", "dp", "threshold" };
        for (int i = 0; i < 5; i++) {
            double t = plan_T(&prob, names[i], NULL);
            seeds = t < seeds ? t : seeds;
        }
        ck_assert_msg(ta <= seeds * (1 + 1e-12), "%s: gradssa %.9g worse than best seed %.9g",
                      dear_sched_name((dear_sched_t)s), ta, seeds);
        /* The best seed respects the cap (per-layer buckets do), so gradssa's plan must too. */
        for (int g = 0; g < a.rs.ngroups; g++) {
            size_t bytes = 0;
            for (int t = a.rs.first[g]; t < a.rs.first[g + 1]; t++)
                bytes += p.tensors[t].bytes;
            ck_assert(bytes <= cap);
        }
        /* auto is no worse than gradssa, and for dear it is the best of every pair of one
         * planner's buckets and another's all-gather groups, found here by brute force. */
        dear_plan_t au = { 0 };
        double tauto = plan_T(&prob, "auto", &au);
        ck_assert(tauto <= ta * (1 + 1e-12));
        ck_assert(strncmp(au.planner, "auto:", 5) == 0);
        static const char *const cands[] = { "none", "threshold", "mgwfbp", "dp", "gradssa" };
        dear_plan_t cp[5] = { 0 };
        for (int i = 0; i < 5; i++)
            plan_T(&prob, cands[i], &cp[i]);
        double brute = INFINITY;
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 5; j++) {
                if (s != DEAR_SCHED_DEAR && i != j)
                    continue;
                dear_plan_t mix = { .nunits = cp[i].nunits, .ntensors = cp[i].ntensors, .rs = cp[i].rs, .ag = cp[j].ag };
                double t = sim_T(&p, &prob.cost, prob.sched, &mix);
                brute = t < brute ? t : brute;
            }
        /* (or better, where it moved single groups into or out of backward) */
        ck_assert_msg(au.early ? tauto < brute : fabs(tauto - brute) <= 1e-12 * brute, "%s: auto %.9g, best pair %.9g (%s)",
                      dear_sched_name((dear_sched_t)s), tauto, brute, au.planner);
        for (int i = 0; i < 5; i++)
            dear_plan_free(&cp[i]);
        dear_plan_free(&au);
        dear_plan_free(&a);
        dear_plan_free(&b);
    }
    dear_prof_free(&p);
}
END_TEST

/* auto's runners-up: auto's own plan unchanged; each runner-up's buckets unlike the plan's and
 * each other's, and under schedule dear its all-gather groups unlike the plan's too (the
 * candidates always offer others: one group, one per tensor); predicted as the simulator says, no
 * faster than the plan and in order; the plan's buckets halved among them (wherever the plan has
 * more than one bucket). */
START_TEST(auto_runners_up)
{
    static const char *const models[] = { "resnet50", "bert-base", "gpt2-small" };
    static const int scheds[2] = { DEAR_SCHED_WFBP, DEAR_SCHED_DEAR };
    for (int mi = 0; mi < 3; mi++)
        for (int si = 0; si < 2; si++) {
            dear_profile_t p;
            dear_cost_model_t m;
            shipped_10gbe(models[mi], &p, &m);
            dear_sim_model_arg_t marg;
            dear_plan_problem_t prob;
            ck_assert_int_eq(dear_plan_problem_init(&prob, &p, (dear_sched_t)scheds[si], &m, 0, &marg), DEAR_OK);
            prob.rounds = 30;
            dear_plan_t au = { 0 }, best = { 0 }, run[DEAR_AUTO_MAX_RUNNERS];
            memset(run, 0, sizeof run);
            double pred[DEAR_AUTO_MAX_RUNNERS];
            int n = -1;
            double tauto = plan_T(&prob, "auto", &au);
            ck_assert_int_eq(dear_plan_auto_runners(&best, &prob, run, pred, 99, &n, NULL, NULL), DEAR_OK);
            ck_assert(dear_plan_equal(&best, &au));
            ck_assert_msg(n >= 2 && n <= DEAR_AUTO_MAX_RUNNERS, "%s: %d runner(s)-up", models[mi], n);
            int halved = 0;
            for (int k = 0; k < n; k++) {
                char want[16];
                snprintf(want, sizeof want, "auto-%d:", k + 2);
                ck_assert_msg(strncmp(run[k].planner, want, strlen(want)) == 0, "runner %d named %s", k, run[k].planner);
                halved += strstr(run[k].planner, "/2") != NULL && run[k].rs.ngroups == (au.rs.ngroups + 1) / 2;
                double t = sim_T(&p, &prob.cost, prob.sched, &run[k]);
                ck_assert_msg(fabs(t - pred[k]) <= 1e-12 * t, "runner %d predicted %.9g, simulated %.9g", k, pred[k], t);
                ck_assert(pred[k] >= tauto * (1 - 1e-12));
                ck_assert(k == 0 || pred[k] >= pred[k - 1]);
                ck_assert_int_eq(dear_plan_validate(&run[k], p.ntensors, NULL, 0), DEAR_OK);
                ck_assert_msg(scheds[si] != DEAR_SCHED_DEAR || !dear_partition_equal(&run[k].ag, &au.ag),
                              "%s: runner %d (%s) has the plan's %d all-gather groups", models[mi], k, run[k].planner,
                              au.ag.ngroups);
                for (int j = -1; j < k; j++) {
                    const dear_partition_t *a = j < 0 ? &au.rs : &run[j].rs, *b = &run[k].rs;
                    ck_assert_msg(a->ngroups != b->ngroups ||
                                      memcmp(a->first, b->first, sizeof(int) * (size_t)(a->ngroups + 1)) != 0,
                                  "%s: runner %d has the buckets of %d", models[mi], k, j);
                }
            }
            ck_assert_msg(halved == (au.rs.ngroups > 1), "%s/%s: the plan's %d buckets halved: %d", models[mi],
                          dear_sched_name((dear_sched_t)scheds[si]), au.rs.ngroups, halved);
            for (int k = 0; k < n; k++)
                dear_plan_free(&run[k]);
            dear_plan_free(&best);
            dear_plan_free(&au);
            dear_prof_free(&p);
        }
}
END_TEST

/* 1 if the plan's early all-gather groups are not the trailing run of its ag_early groups */
static int early_scattered(const dear_plan_t *plan)
{
    for (int g = 0; g < plan->ag.ngroups; g++)
        if (dear_plan_is_early(plan, g) != (g >= plan->ag.ngroups - plan->ag_early))
            return 1;
    return 0;
}

/* The collectives plan starts per iteration under schedule sched. */
static int plan_colls(const dear_plan_t *plan, int sched)
{
    return plan->rs.ngroups + (sched == DEAR_SCHED_DEAR ? plan->ag.ngroups : 0);
}

/* auto's tied plan, against brute force. First the candidates' whole plans (as each planner
 * alone makes them): wherever one with buckets unlike auto's simulates within DEAR_AUTO_TIE of
 * auto's own iteration, the tied plan is such a whole plan, of the most collectives of those and
 * then the lowest time. Elsewhere, wherever a candidate's buckets unlike auto's, with auto's
 * all-gather side, simulate within DEAR_AUTO_TIE, a tied plan is offered with at least as many
 * buckets as each such candidate; where it has such a candidate's buckets, it has auto's
 * all-gather side whole, early set included (10GbE at P 8 gives auto early groups that are not a
 * trailing run). Each tied plan simulates to what it is said to, within DEAR_AUTO_TIE of auto's
 * plan, with buckets unlike auto's; auto's plan and runners-up are as without it. Ties of both
 * kinds happen (where the reduce-scatters hide under backward). */
START_TEST(auto_tied_plan)
{
    static const char *const models[] = { "resnet50", "vgg16", "densenet201", "bert-base", "gpt2-small" };
    static const char *const presets[] = { "10gbe", "shm" };
    static const int workers[] = { 4, 8, 64 }, scheds[2] = { DEAR_SCHED_WFBP, DEAR_SCHED_DEAR };
    static const char *const cands[] = { "none", "threshold", "mgwfbp", "dp", "gradssa" };
    enum { NCAND = 5 };
    int ties = 0, cases = 0, wholes = 0, pairs = 0, scattered = 0;
    for (int mi = 0; mi < 5; mi++)
        for (int pi = 0; pi < 2; pi++)
            for (int wi = 0; wi < 3; wi++)
                for (int si = 0; si < 2; si++) {
                    dear_profile_t p;
                    load_shipped(models[mi], &p);
                    dear_cost_model_t m;
                    ck_assert_int_eq(dear_cost_preset(presets[pi], workers[wi], 1, &m), DEAR_OK);
                    dear_sim_model_arg_t marg;
                    dear_plan_problem_t prob;
                    ck_assert_int_eq(dear_plan_problem_init(&prob, &p, (dear_sched_t)scheds[si], &m, 0, &marg),
                                     DEAR_OK);
                    dear_plan_t au = { 0 }, best = { 0 }, tie = { 0 }, run[DEAR_AUTO_MAX_RUNNERS],
                                run0[DEAR_AUTO_MAX_RUNNERS];
                    memset(run, 0, sizeof run);
                    memset(run0, 0, sizeof run0);
                    double pred[DEAR_AUTO_MAX_RUNNERS], pred0[DEAR_AUTO_MAX_RUNNERS], tie_pred = 0;
                    int n = -1, n0 = -1;
                    double tauto = plan_T(&prob, "auto", &au);
                    ck_assert_int_eq(dear_plan_auto_runners(&best, &prob, run, pred, 3, &n, &tie, &tie_pred), DEAR_OK);
                    ck_assert(dear_plan_equal(&best, &au));
                    ck_assert_int_eq(dear_plan_auto_runners(&best, &prob, run0, pred0, 3, &n0, NULL, NULL), DEAR_OK);
                    ck_assert_int_eq(n, n0);
                    for (int k = 0; k < n; k++)
                        ck_assert(dear_plan_equal(&run[k], &run0[k]) && pred[k] == pred0[k]);
                    const char *what = models[mi];
                    const double limit = tauto * (1 + DEAR_AUTO_TIE);
                    dear_plan_t cp[NCAND];
                    memset(cp, 0, sizeof cp);
                    /* brute force, first: the whole plans that tie; the most collectives, then the fastest */
                    int most_c = -1, is_whole = 0;
                    double fastest = INFINITY;
                    for (int c = 0; c < NCAND; c++) {
                        ck_assert_int_eq(dear_plan_by_name(&cp[c], &prob, cands[c]), DEAR_OK);
                        double t = sim_T(&p, &prob.cost, prob.sched, &cp[c]);
                        if (dear_partition_equal(&cp[c].rs, &au.rs) || t > limit)
                            continue;
                        int k = plan_colls(&cp[c], scheds[si]);
                        if (k > most_c || (k == most_c && t < fastest))
                            most_c = k, fastest = t;
                    }
                    for (int c = 0; c < NCAND && most_c >= 0; c++)
                        is_whole |= tie.nunits > 0 && dear_plan_equal(&tie, &cp[c]);
                    if (most_c >= 0) {
                        ck_assert_msg(is_whole, "%s/%s/P=%d/%s: a candidate's whole plan ties auto, tied plan %s "
                                                "is none of them", what, presets[pi], workers[wi],
                                      dear_sched_name((dear_sched_t)scheds[si]), tie.nunits ? tie.planner : "(none)");
                        ck_assert_msg(plan_colls(&tie, scheds[si]) == most_c && tie_pred == fastest,
                                      "%s: tied plan of %d collectives at %.12g, the most tied %d at %.12g", what,
                                      plan_colls(&tie, scheds[si]), tie_pred, most_c, fastest);
                        wholes++;
                    }
                    /* else: a candidate's buckets with auto's all-gather side tie */
                    int must = most_c >= 0, most = 0;
                    for (int c = 0; c < NCAND && most_c < 0; c++) {
                        /* auto's all-gather side whole: its groups and its early set */
                        dear_plan_t mix = { 0 };
                        ck_assert_int_eq(dear_plan_copy(&mix, &au), DEAR_OK);
                        ck_assert_int_eq(dear_partition_set(&mix.rs, mix.nunits, cp[c].rs.ngroups, cp[c].rs.first),
                                         DEAR_OK);
                        if (!dear_partition_equal(&cp[c].rs, &au.rs) &&
                            sim_T(&p, &prob.cost, prob.sched, &mix) <= limit) {
                            must = 1;
                            most = cp[c].rs.ngroups > most ? cp[c].rs.ngroups : most;
                            /* the tied plan keeps auto's all-gather side where that side ties */
                            if (tie.nunits > 0 && dear_partition_equal(&tie.rs, &cp[c].rs)) {
                                ck_assert_msg(dear_plan_equal(&tie, &mix), "%s: tied plan %s lost auto's %s",
                                              models[mi], tie.planner, "all-gather side");
                                pairs++;
                                scattered += early_scattered(&au);
                            }
                        }
                        dear_plan_free(&mix);
                    }
                    for (int c = 0; c < NCAND; c++)
                        dear_plan_free(&cp[c]);
                    ck_assert_msg(!must || tie.nunits > 0, "%s/%s/P=%d/%s: a candidate ties auto, no tied plan", what,
                                  presets[pi], workers[wi], dear_sched_name((dear_sched_t)scheds[si]));
                    if (tie.nunits > 0) {
                        ties++;
                        double t = sim_T(&p, &prob.cost, prob.sched, &tie);
                        ck_assert_msg(t == tie_pred && t <= limit, "%s: tied plan %.12g, said %.12g, auto %.12g", what,
                                      t, tie_pred, tauto);
                        ck_assert_msg(strncmp(tie.planner, "auto-tie:", 9) == 0, "tied plan named %s", tie.planner);
                        ck_assert(!dear_partition_equal(&tie.rs, &au.rs));
                        ck_assert_msg(tie.rs.ngroups >= most, "%s: tied plan %d buckets, a candidate tied with %d",
                                      what, tie.rs.ngroups, most);
                        ck_assert_int_eq(dear_plan_validate(&tie, p.ntensors, NULL, 0), DEAR_OK);
                    }
                    cases++;
                    for (int k = 0; k < n; k++)
                        dear_plan_free(&run[k]), dear_plan_free(&run0[k]);
                    dear_plan_free(&tie);
                    dear_plan_free(&best);
                    dear_plan_free(&au);
                    dear_prof_free(&p);
                }
    fprintf(stderr, "auto_tied_plan: %d tie(s) in %d cases: %d whole plans, %d with auto's all-gather side (%d of "
                    "them scattered)\n", ties, cases, wholes, pairs, scattered);
    ck_assert_msg(wholes > 0 && pairs > 0, "%d tie(s): %d whole plans, %d with auto's all-gather side, in %d cases",
                  ties, wholes, pairs, cases);
}
END_TEST

START_TEST(gradssa_within_1pct_of_dp_on_shipped)
{
    static const char *const models[] = { "resnet50", "vgg16", "densenet201", "bert-base", "gpt2-small" };
    dear_cost_model_t m;
    ck_assert_int_eq(dear_cost_preset("10gbe", 64, 1, &m), DEAR_OK);
    for (int i = 0; i < 5; i++) {
        dear_profile_t p;
        load_shipped(models[i], &p);
        dear_sim_model_arg_t marg;
        dear_plan_problem_t prob;
        ck_assert_int_eq(dear_plan_problem_init(&prob, &p, DEAR_SCHED_DEAR, &m, 0, &marg), DEAR_OK);
        prob.rounds = 30;
        double tdp = plan_T(&prob, "dp", NULL), tssa = plan_T(&prob, "gradssa", NULL);
        ck_assert_msg(tssa <= 1.01 * tdp, "%s: gradssa %.6g vs dp %.6g", models[i], tssa, tdp);
        /* DP is exact here, so nothing may beat it by more than rounding. */
        ck_assert_msg(tssa >= tdp * (1 - 1e-9), "%s: gradssa %.9g beat the exact dp %.9g", models[i], tssa, tdp);
        dear_prof_free(&p);
    }
}
END_TEST

/* prob.no_early (sharded updates): dp, gradssa and auto plan no early all-gather group, and each
 * predicts no less than without the flag (it only removes choices); without it the shipped
 * bert-base under 10GbE gets early groups from auto, so the flag is what removes them. */
START_TEST(no_early_plans)
{
    dear_profile_t p;
    dear_cost_model_t m;
    shipped_10gbe("bert-base", &p, &m);
    dear_sim_model_arg_t marg;
    dear_plan_problem_t prob;
    ck_assert_int_eq(dear_plan_problem_init(&prob, &p, DEAR_SCHED_DEAR, &m, 0, &marg), DEAR_OK);
    prob.rounds = 20;
    static const char *const names[] = { "dp", "gradssa", "auto" };
    int early_free = 0;
    for (int i = 0; i < 3; i++) {
        dear_plan_t a = { 0 }, b = { 0 };
        prob.no_early = 0;
        double ta = plan_T(&prob, names[i], &a);
        prob.no_early = 1;
        double tb = plan_T(&prob, names[i], &b);
        ck_assert_msg(b.ag_early == 0, "%s with no_early: %d early groups", names[i], b.ag_early);
        ck_assert_msg(tb >= ta * (1 - 1e-9), "%s: %.9g without early groups beats %.9g with them", names[i], tb, ta);
        early_free += a.ag_early > 0;
        dear_plan_free(&a);
        dear_plan_free(&b);
    }
    ck_assert_msg(early_free > 0, "no planner used early groups without the flag");
    dear_prof_free(&p);
}
END_TEST


/* Equal predictions go to the plan of fewer collectives. Where compute hides the reduce-scatters,
 * every bucketing predicts the same iteration; auto then takes the fewest buckets and all-gather
 * groups among the equal pairings (brute force over every candidate's buckets, every candidate's
 * groups and every early count), not the first candidate in its table. */
START_TEST(auto_ties_fewest_collectives)
{
    static const char *const models[] = { "densenet201", "resnet50", "bert-base", "vgg16" };
    static const char *const cands[] = { "none", "threshold", "mgwfbp", "dp", "gradssa" };
    static const double scales[] = { 1, 4, 16 };
    int tied = 0; /* cases where an equal pairing had more collectives than auto's plan */
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++)
        for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
            dear_profile_t p;
            dear_cost_model_t m;
            shipped_10gbe(models[mi], &p, &m);
            for (int l = 0; l < p.nlayers; l++) { /* more compute: more of the communication hidden */
                p.layers[l].fwd_s *= scales[si];
                p.layers[l].bwd_s *= scales[si];
            }
            dear_sim_model_arg_t marg;
            dear_plan_problem_t prob;
            ck_assert_int_eq(dear_plan_problem_init(&prob, &p, DEAR_SCHED_DEAR, &m, 0, &marg), DEAR_OK);
            prob.rounds = 20;
            prob.seed = 7;
            dear_plan_t au = { 0 }, cp[5] = { { 0 } };
            double tauto = plan_T(&prob, "auto", &au);
            int nauto = au.rs.ngroups + au.ag.ngroups, more = 0;
            for (int i = 0; i < 5; i++)
                plan_T(&prob, cands[i], &cp[i]);
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 5; j++)
                    for (int ne = 0; ne <= cp[j].ag.ngroups; ne++) {
                        dear_plan_t mix = { .nunits = cp[i].nunits, .ntensors = cp[i].ntensors, .rs = cp[i].rs,
                                            .ag = cp[j].ag, .ag_early = ne };
                        double t = sim_T(&p, &prob.cost, prob.sched, &mix);
                        ck_assert_msg(t >= tauto, "%s x%g: %s+%s (%d early) %.12g beats auto %.12g", models[mi],
                                      scales[si], cands[i], cands[j], ne, t, tauto);
                        int n = cp[i].rs.ngroups + cp[j].ag.ngroups;
                        ck_assert_msg(t > tauto || n >= nauto,
                                      "%s x%g: %s+%s predicts auto's %.12g with %d collectives, auto's %s %d",
                                      models[mi], scales[si], cands[i], cands[j], t, n, au.planner, nauto);
                        more |= t == tauto && n > nauto;
                    }
            tied += more;
            for (int i = 0; i < 5; i++)
                dear_plan_free(&cp[i]);
            dear_plan_free(&au);
            dear_prof_free(&p);
        }
    ck_assert_msg(tied > 0, "no case had equal predictions with more collectives: the rule went untested");
}
END_TEST

/* ---- early all-gather groups in any set ---- */

/* A shipped profile with a linear cost of no start-up whose communication (both phases) takes
 * about `ratio` times the compute. */
static lin_arg_t balanced(const char *model, dear_profile_t *p, double ratio)
{
    dear_cost_model_t m;
    shipped_10gbe(model, p, &m);
    double bytes = 0, comp = dear_prof_fwd_total(p) + dear_prof_bwd_total(p);
    for (int t = 0; t < p->ntensors; t++)
        bytes += (double)p->tensors[t].bytes;
    return lin(0, ratio * comp / bytes, 0, ratio * comp / bytes / 2);
}

/* Marks of the last ne of ng groups. */
static void trailing_marks(unsigned char *em, int ng, int ne)
{
    for (int g = 0; g < ng; g++)
        em[g] = g >= ng - ne;
}

/* The simulator's early groups given one by one: a trailing run as marks predicts what its
 * count does, bit for bit (unsharded and sharded, slices stepped in backward); a plan carrying
 * marks predicts what the marks do through the workspace; and a recorded iteration runs the
 * channel in the runtime's order (runtime/buckets.c, ops_order): the regular groups in forward
 * order, then each bucket, last first, followed by the early groups its reduce-scatter completes
 * (the bucket holding a group's first unit), last first. */
START_TEST(sim_early_marks)
{
    static const char *const models[] = { "gpt2-small", "resnet50" };
    static const char *const names[] = { "none", "threshold", "dp" };
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        dear_profile_t p;
        lin_arg_t l = balanced(models[mi], &p, 1);
        dear_plan_problem_t prob;
        problem_linear(&prob, &p, DEAR_SCHED_DEAR, &l);
        prob.threshold = 25u << 20;
        dear_sim_ws_t *ws;
        ck_assert_int_eq(dear_sim_ws_create(&p, &ws), DEAR_OK);
        dear_plan_t cp[3] = { { 0 } };
        for (int i = 0; i < 3; i++)
            ck_assert_int_eq(dear_plan_by_name(&cp[i], &prob, names[i]), DEAR_OK);
        for (int shard = 0; shard < 2; shard++) {
            dear_sim_ws_set_shard(ws, shard ? DEAR_SIM_SHARD_EARLY : DEAR_SIM_SHARD_NONE);
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 3; j++) {
                    int ng = cp[j].ag.ngroups;
                    unsigned char *em = malloc((size_t)ng);
                    ck_assert_ptr_nonnull(em);
                    for (int ne = 0; ne <= ng; ne += ng > 8 ? ng / 8 : 1) {
                        trailing_marks(em, ng, ne);
                        double a = dear_sim_ws_iter(ws, &prob.cost, DEAR_SCHED_DEAR, cp[i].rs.ngroups, cp[i].rs.first,
                                                    ng, cp[j].ag.first, ne);
                        double b = dear_sim_ws_iter_early(ws, &prob.cost, DEAR_SCHED_DEAR, cp[i].rs.ngroups,
                                                          cp[i].rs.first, ng, cp[j].ag.first, 0, em);
                        ck_assert_msg(a == b, "%s %s+%s %d early, shard %d: count %.17g, marks %.17g", models[mi],
                                      names[i], names[j], ne, shard, a, b);
                    }
                    free(em);
                }
        }
        /* Every third group early, from the first: not a trailing run. */
        dear_plan_t mix = { 0 };
        plan2(&mix, p.ntensors, cp[0].rs.ngroups, cp[0].rs.first, cp[2].ag.ngroups, cp[2].ag.first);
        int ng = mix.ag.ngroups, nb = mix.rs.ngroups;
        unsigned char *em = malloc((size_t)ng);
        ck_assert_ptr_nonnull(em);
        for (int g = 0; g < ng; g++)
            em[g] = g % 3 == 0;
        ck_assert_int_eq(dear_plan_set_early(&mix, em), DEAR_OK);
        ck_assert_ptr_nonnull(mix.early);
        dear_sim_ws_set_shard(ws, DEAR_SIM_SHARD_NONE);
        dear_sim_result_t r = { 0 };
        ck_assert_int_eq(dear_sim_run(&p, &prob.cost, DEAR_SCHED_DEAR, &mix, 1, &r), DEAR_OK);
        EQ(r.iter_s, dear_sim_ws_iter_early(ws, &prob.cost, DEAR_SCHED_DEAR, nb, mix.rs.first, ng, mix.ag.first, 0,
                                            em));
        /* The expected channel: kinds and indices. */
        int *want = malloc(sizeof(int) * 2 * (size_t)(nb + ng)), nw = 0;
        ck_assert_ptr_nonnull(want);
        for (int g = 0; g < ng; g++)
            if (!em[g])
                want[nw++] = DEAR_COLL_ALLGATHER, want[nw++] = g;
        for (int b = nb - 1; b >= 0; b--) {
            want[nw++] = DEAR_COLL_REDUCE_SCATTER, want[nw++] = b;
            for (int g = ng - 1; g >= 0; g--)
                if (em[g] && group_of(&mix.rs, mix.ag.first[g]) == b)
                    want[nw++] = DEAR_COLL_ALLGATHER, want[nw++] = g;
        }
        int k = 0;
        double last = -INFINITY;
        for (int i = 0; i < r.nops; i++) {
            const dear_sim_op_t *o = &r.ops[i];
            if (o->kind != DEAR_COLL_REDUCE_SCATTER && o->kind != DEAR_COLL_ALLGATHER)
                continue;
            ck_assert_int_lt(k, nw);
            ck_assert_msg(o->kind == want[k] && o->index == want[k + 1] && o->start >= last,
                          "%s: channel op %d is %s %d at %.9g, expected %s %d", models[mi], k / 2,
                          o->kind == DEAR_COLL_ALLGATHER ? "all-gather" : "reduce-scatter", o->index, o->start,
                          want[k] == DEAR_COLL_ALLGATHER ? "all-gather" : "reduce-scatter", want[k + 1]);
            last = o->start;
            k += 2;
        }
        ck_assert_int_eq(k, nw);
        free(want);
        free(em);
        dear_sim_result_free(&r);
        dear_plan_free(&mix);
        for (int i = 0; i < 3; i++)
            dear_plan_free(&cp[i]);
        dear_sim_ws_free(ws);
        dear_prof_free(&p);
    }
}
END_TEST

/* The buckets of rs with the groups of ag at every count of trailing early groups: the fastest
 * prediction, its count in *be (the fewest of equal ones). */
static double best_trailing(const dear_profile_t *p, const dear_plan_problem_t *prob, const dear_plan_t *rs,
                            const dear_plan_t *ag, int *be)
{
    double best = INFINITY;
    *be = 0;
    for (int ne = 0; ne <= ag->ag.ngroups; ne++) {
        dear_plan_t mix = { .nunits = rs->nunits, .ntensors = rs->ntensors, .rs = rs->rs, .ag = ag->ag,
                            .ag_early = ne };
        double t = sim_T(p, &prob->cost, prob->sched, &mix);
        if (t < best)
            best = t, *be = ne;
    }
    return best;
}

/* auto moves single all-gather groups into or out of backward. On gpt2-small with communication
 * equal to compute (no start-ups: where the first layers' all-gathers outrun their forward), the
 * best pairing of the candidates with a trailing run of early groups (brute force over every
 * count) leaves the forward waiting; auto's marks beat it by more than 2%, and are not a trailing
 * run. Where no group may run early, auto marks none. Its prediction is the simulator's. */
START_TEST(auto_early_any_groups)
{
    dear_profile_t p;
    lin_arg_t l = balanced("gpt2-small", &p, 1);
    dear_plan_problem_t prob;
    problem_linear(&prob, &p, DEAR_SCHED_DEAR, &l);
    prob.threshold = 25u << 20;
    prob.rounds = 20;
    dear_plan_t au = { 0 }, cp[5] = { { 0 } };
    double tauto = plan_T(&prob, "auto", &au);
    static const char *const cands[] = { "none", "threshold", "mgwfbp", "dp", "gradssa" };
    double brute = INFINITY;
    for (int i = 0; i < 5; i++)
        plan_T(&prob, cands[i], &cp[i]);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            int be;
            double t = best_trailing(&p, &prob, &cp[i], &cp[j], &be);
            brute = t < brute ? t : brute;
        }
    ck_assert_msg(tauto < brute * 0.98, "auto %.9g, best trailing pairing %.9g (%s, %d early)", tauto, brute,
                  au.planner, au.ag_early);
    ck_assert_ptr_nonnull(au.early);
    char msg[256];
    ck_assert_int_eq(dear_plan_validate(&au, p.ntensors, msg, sizeof msg), DEAR_OK);
    prob.no_early = 1;
    dear_plan_t ne = { 0 };
    plan_T(&prob, "auto", &ne);
    ck_assert_int_eq(ne.ag_early, 0);
    ck_assert_ptr_null(ne.early);
    dear_plan_free(&ne);
    for (int i = 0; i < 5; i++)
        dear_plan_free(&cp[i]);
    dear_plan_free(&au);
    dear_prof_free(&p);
}
END_TEST

/* The test's own search for early groups: from the trailing run ne of rs's buckets with ag's
 * groups, each group, last first, flipped into or out of backward where the simulator predicts
 * the iteration faster (by more than 1e-9 of it), pass after pass until none is: the prediction
 * it ends at. */
static double greedy_early(const dear_profile_t *p, const dear_plan_problem_t *prob, const dear_plan_t *rs,
                           const dear_plan_t *ag, int ne)
{
    dear_sim_ws_t *ws = NULL;
    ck_assert_int_eq(dear_sim_ws_create(p, &ws), DEAR_OK);
    int ng = ag->ag.ngroups;
    unsigned char *em = malloc((size_t)ng);
    ck_assert_ptr_nonnull(em);
    trailing_marks(em, ng, ne);
    double best = dear_sim_ws_iter_early(ws, &prob->cost, prob->sched, rs->rs.ngroups, rs->rs.first, ng,
                                         ag->ag.first, 0, em);
    for (int more = 1; more;) {
        more = 0;
        for (int g = ng - 1; g >= 0; g--) {
            em[g] ^= 1;
            double t = dear_sim_ws_iter_early(ws, &prob->cost, prob->sched, rs->rs.ngroups, rs->rs.first, ng,
                                              ag->ag.first, 0, em);
            if (t < best * (1 - 1e-9))
                best = t, more = 1;
            else
                em[g] ^= 1;
        }
    }
    free(em);
    dear_sim_ws_free(ws);
    return best;
}

/* auto refines every pairing of the candidates' buckets and all-gather groups, not only the
 * fastest with a trailing run (the base), and takes the fastest refined pair where it predicts
 * more than 1% faster than the base. The rule worked out by brute force
 * here (every pair from its best trailing run, searched greedily by the test) on three shipped
 * models with communication equal to compute, each with a start-up per collective of 0, 1.5e-4
 * and 6e-4 of the compute (0, 45 and 180 us at 300 ms): auto predicts what the rule picks, in
 * every case. On gpt2-small at 1.5e-4 it is more than 2% faster than the base (what auto chose
 * before), and in some case the 1% rule keeps the base against a faster pair. */
START_TEST(auto_refines_every_pairing)
{
    static const char *const models[] = { "gpt2-small", "bert-base", "resnet50" };
    static const double ups[] = { 0, 1.5e-4, 6e-4 };
    static const char *const cands[] = { "none", "threshold", "mgwfbp", "dp", "gradssa" };
    int kept = 0;
    for (int mi = 0; mi < 3; mi++)
        for (int ui = 0; ui < 3; ui++) {
            dear_profile_t p;
            lin_arg_t l = balanced(models[mi], &p, 1);
            double comp = dear_prof_fwd_total(&p) + dear_prof_bwd_total(&p);
            l.alpha[DEAR_COLL_REDUCE_SCATTER] = l.alpha[DEAR_COLL_ALLGATHER] = ups[ui] * comp;
            l.alpha[DEAR_COLL_ALLREDUCE] = 2 * ups[ui] * comp;
            dear_plan_problem_t prob;
            problem_linear(&prob, &p, DEAR_SCHED_DEAR, &l);
            prob.threshold = 25u << 20;
            prob.rounds = 20;
            dear_plan_t au = { 0 }, cp[5] = { { 0 } };
            double tauto = plan_T(&prob, "auto", &au);
            for (int i = 0; i < 5; i++)
                plan_T(&prob, cands[i], &cp[i]);
            double tr[5][5], g[5][5], trail = INFINITY;
            int ti = -1, tj = -1;
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 5; j++) {
                    int be;
                    tr[i][j] = best_trailing(&p, &prob, &cp[i], &cp[j], &be);
                    g[i][j] = greedy_early(&p, &prob, &cp[i], &cp[j], be);
                    int nc = cp[i].rs.ngroups + cp[j].ag.ngroups;
                    if (tr[i][j] < trail || (tr[i][j] == trail && nc < cp[ti].rs.ngroups + cp[tj].ag.ngroups))
                        trail = tr[i][j], ti = i, tj = j;
                }
            double base = g[ti][tj], want = base, fastest = base;
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 5; j++) {
                    fastest = g[i][j] < fastest ? g[i][j] : fastest;
                    if (g[i][j] < want && g[i][j] < base * 0.99)
                        want = g[i][j];
                }
            kept += fastest < want;
            ck_assert_msg(fabs(tauto - want) <= 1e-9 * want, "%s, start-up %g: auto %.9g (%s), the rule %.9g (base "
                          "%.9g, fastest refined pair %.9g)", models[mi], ups[ui], tauto, au.planner, want, base,
                          fastest);
            if (mi == 0 && ui == 1)
                ck_assert_msg(tauto < base * 0.98, "gpt2-small: auto %.9g (%s), the base (%s's buckets, %s's "
                              "groups) %.9g", tauto, au.planner, cands[ti], cands[tj], base);
            char msg[256];
            ck_assert_int_eq(dear_plan_validate(&au, p.ntensors, msg, sizeof msg), DEAR_OK);
            for (int i = 0; i < 5; i++)
                dear_plan_free(&cp[i]);
            dear_plan_free(&au);
            dear_prof_free(&p);
        }
    ck_assert_msg(kept > 0, "the 1%% rule never kept the base against a faster pair");
}
END_TEST

/* Marks kept canonical: a trailing run (or none) is a count alone; a copy keeps the marks; equal
 * sets compare equal whichever form; a plan whose marks disagree with its count, or mark a group
 * with other than 0 or 1, is refused. */
START_TEST(plan_early_marks)
{
    int rs[] = { 0, 2, 4 }, ag[] = { 0, 1, 2, 3, 4 };
    dear_plan_t a, b = { 0 };
    plan2(&a, 4, 2, rs, 4, ag);
    unsigned char run[] = { 0, 0, 1, 1 }, gap[] = { 1, 0, 1, 0 }, none[] = { 0, 0, 0, 0 };
    ck_assert_int_eq(dear_plan_set_early(&a, run), DEAR_OK);
    ck_assert_ptr_null(a.early);
    ck_assert_int_eq(a.ag_early, 2);
    ck_assert(!dear_plan_is_early(&a, 1) && dear_plan_is_early(&a, 2));
    ck_assert_int_eq(dear_plan_set_early(&a, gap), DEAR_OK);
    ck_assert_ptr_nonnull(a.early);
    ck_assert_int_eq(a.ag_early, 2);
    ck_assert(dear_plan_is_early(&a, 0) && !dear_plan_is_early(&a, 3));
    ck_assert_int_eq(dear_plan_copy(&b, &a), DEAR_OK);
    ck_assert(dear_plan_equal(&a, &b) && b.early != a.early);
    ck_assert_int_eq(dear_plan_set_early(&b, run), DEAR_OK);
    ck_assert(!dear_plan_equal(&a, &b));
    ck_assert_int_eq(dear_plan_set_early(&a, none), DEAR_OK);
    ck_assert(a.early == NULL && a.ag_early == 0);
    ck_assert_int_eq(dear_plan_set_early(&a, gap), DEAR_OK);
    char msg[256];
    a.ag_early = 3;
    ck_assert_int_eq(dear_plan_validate(&a, 4, msg, sizeof msg), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(msg, "2 all-gather group(s) marked early, the plan counts 3") != NULL, "%s", msg);
    a.ag_early = 2;
    a.early[1] = 2;
    ck_assert_int_eq(dear_plan_validate(&a, 4, msg, sizeof msg), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(msg, "early mark 2 of all-gather group 1") != NULL, "%s", msg);
    dear_plan_free(&a);
    ck_assert_ptr_null(a.early);
    dear_plan_free(&b);
}
END_TEST

/* ---- units: tensors cut into chunks ---- */

/* Every cut tensor's chunks against the rule worked out independently: k = ceil(B / P) chunks
 * (fewer only when B / align whole alignments are fewer), back to back from 0 to B, every
 * boundary a multiple of the alignment and within one alignment of i B / k. */
static void check_cut(int n, const dear_tensor_desc_t *d, size_t partition, const dear_unit_t *u, int nu)
{
    int i = 0;
    for (int t = 0; t < n; t++) {
        size_t B = d[t].bytes, align = d[t].row_bytes ? d[t].row_bytes : DEAR_UNIT_ALIGN;
        size_t k = partition && B > partition ? (B + partition - 1) / partition : 1;
        if (k > B / align)
            k = B / align > 0 ? B / align : 1;
        if (k == 1) {
            ck_assert(!u || (u[i].tensor == t && u[i].offset == 0 && u[i].bytes == 0));
            i++;
            continue;
        }
        ck_assert_ptr_nonnull(u);
        for (size_t c = 0; c < k; c++, i++) {
            ck_assert_int_lt(i, nu);
            ck_assert_int_eq(u[i].tensor, t);
            double ideal = (double)c * (double)B / (double)k;
            ck_assert_msg(u[i].offset % align == 0 && (double)u[i].offset <= ideal &&
                          (double)u[i].offset > ideal - (double)align,
                          "tensor %d chunk %zu at %zu, ideal %.1f, align %zu", t, c, u[i].offset, ideal, align);
            ck_assert_uint_gt(u[i].bytes, 0);
            size_t end = c + 1 < k ? u[i + 1].offset : B;
            ck_assert_uint_eq(u[i].offset + u[i].bytes, end);
        }
    }
    ck_assert_int_eq(i, nu);
}

START_TEST(units_cut_rules)
{
    dear_tensor_desc_t d[5] = {
        { .bytes = 1000, .layer = 0, .elem_bytes = 4 },
        { .bytes = 10000, .layer = 1, .elem_bytes = 2 },
        { .bytes = 9600, .layer = 1, .elem_bytes = 4, .row_bytes = 1200 },  /* 8 rows */
        { .bytes = 3000, .layer = 2, .elem_bytes = 8 },
        { .bytes = 64 * 1000 + 12, .layer = 3, .elem_bytes = 4 },
    };
    static const size_t parts[] = { 0, 1, 64, 100, 2999, 3000, 3001, 5000, 20000, 1 << 30 };
    for (size_t pi = 0; pi < sizeof parts / sizeof *parts; pi++) {
        dear_unit_t *u = NULL;
        int nu = -1;
        ck_assert_int_eq(dear_units_cut(5, d, parts[pi], &u, &nu), DEAR_OK);
        check_cut(5, d, parts[pi], u, nu);
        char msg[256];
        ck_assert_msg(dear_units_check(5, d, nu, u, msg, sizeof msg) == DEAR_OK, "partition %zu: %s", parts[pi], msg);
        /* The descriptors say which chunk of how many. */
        dear_tensor_desc_t *ud = NULL;
        ck_assert_int_eq(dear_units_descs(5, d, nu, u, &ud), DEAR_OK);
        for (int i = 0; i < nu; i++) {
            int t = u ? u[i].tensor : i, k = 0, c = 0;
            for (int j = 0; j < nu; j++)
                if ((u ? u[j].tensor : j) == t) {
                    c += j < i;
                    k++;
                }
            ck_assert_int_eq(ud[i].nchunks, k);
            ck_assert_int_eq(ud[i].chunk, c);
            ck_assert_uint_eq(ud[i].bytes, u && u[i].bytes ? u[i].bytes : d[t].bytes);
            ck_assert_int_eq(ud[i].layer, d[t].layer);
        }
        free(ud);
        free(u);
    }
    /* By hand at 3000 bytes: 10000 in 4 chunks at 64-byte boundaries (2500 -> 2496, 5000 -> 4992,
     * 7500 -> 7488), the sparse 9600 in 4 on rows of 1200 (2400, 4800, 7200), 3000 whole. */
    dear_unit_t *u = NULL;
    int nu = 0;
    ck_assert_int_eq(dear_units_cut(5, d, 3000, &u, &nu), DEAR_OK);
    ck_assert_int_eq(nu, 1 + 4 + 4 + 1 + 22);
    ck_assert_uint_eq(u[2].offset, 2496);
    ck_assert_uint_eq(u[3].offset, 4992);
    ck_assert_uint_eq(u[4].offset, 7488);
    ck_assert_uint_eq(u[4].bytes, 2512);
    ck_assert_uint_eq(u[6].offset, 2400);
    ck_assert_uint_eq(u[8].offset, 7200);
    free(u);
    /* Nothing to cut: no table. */
    ck_assert_int_eq(dear_units_cut(5, d, 0, &u, &nu), DEAR_OK);
    ck_assert_ptr_null(u);
    ck_assert_int_eq(nu, 5);
    /* More units than a plan may have: refused, naming the partition. */
    dear_tensor_desc_t huge = { .bytes = (size_t)DEAR_UNITS_MAX * 2 * DEAR_UNIT_ALIGN, .layer = 0, .elem_bytes = 4 };
    capture();
    ck_assert_int_eq(dear_units_cut(1, &huge, 64, &u, &nu), DEAR_ERR_ARG);
    uncapture();
    ck_assert_msg(strstr(logbuf, "partition size 64 bytes") && strstr(logbuf, "units"), "%s", logbuf);
}
END_TEST

START_TEST(units_check_refuses_bad_cuts)
{
    dear_tensor_desc_t d[2] = { { .bytes = 1000, .layer = 0, .elem_bytes = 2 },
                                { .bytes = 1200, .layer = 1, .elem_bytes = 4, .row_bytes = 400 } };
    char msg[256];
    struct {
        dear_unit_t u[4];
        int nu;
        const char *says;
    } bad[] = {
        { { { 0, 0, 501 }, { 0, 501, 499 }, { 1, 0, 0 } }, 3, "inside an element of 2 bytes" },
        { { { 0, 0, 0 }, { 1, 0, 600 }, { 1, 600, 600 } }, 3, "inside a row of 400 bytes" },
        { { { 0, 0, 500 }, { 0, 500, 600 }, { 1, 0, 0 } }, 3, "outside it" },
        { { { 0, 0, 500 }, { 0, 500, 400 }, { 1, 0, 0 } }, 3, "must end at its end" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ck_assert_int_eq(dear_units_check(2, d, bad[i].nu, bad[i].u, msg, sizeof msg), DEAR_ERR_MISMATCH);
        ck_assert_msg(strstr(msg, bad[i].says) != NULL, "case %zu: %s", i, msg);
    }
    /* The plan's own shape: chunks back to back, at least two, tensors in order. */
    dear_plan_t pl = { 0 };
    int first[2] = { 0, 3 };
    ck_assert_int_eq(dear_plan_same(&pl, 3, 1, first, "x"), DEAR_OK);
    dear_unit_t overlap[3] = { { 0, 0, 600 }, { 0, 500, 500 }, { 1, 0, 0 } };
    ck_assert_int_eq(dear_plan_set_units(&pl, 2, overlap), DEAR_ERR_ARG);
    dear_unit_t order[3] = { { 1, 0, 0 }, { 0, 0, 500 }, { 0, 500, 500 } };
    ck_assert_int_eq(dear_plan_set_units(&pl, 2, order), DEAR_ERR_ARG);
    dear_unit_t ok[3] = { { 0, 0, 500 }, { 0, 500, 500 }, { 1, 0, 0 } };
    ck_assert_int_eq(dear_plan_set_units(&pl, 2, ok), DEAR_OK);
    ck_assert_int_eq(pl.ntensors, 2);
    ck_assert_int_eq(dear_plan_validate(&pl, 2, msg, sizeof msg), DEAR_OK);
    dear_plan_free(&pl);
}
END_TEST

/* A four-layer model whose tensors the partitions below leave whole, cut in two, or cut into
 * many chunks; a sparse one among them. */
static void chunk_model(dear_profile_t *p)
{
    double fw[4] = { 2e-3, 1e-3, 3e-3, 1e-3 }, bw[4] = { 4e-3, 2e-3, 6e-3, 2e-3 };
    int lay[5] = { 0, 1, 1, 2, 3 };
    size_t by[5] = { 40000, 2000, 300032, 8000, 120000 };
    make_prof(p, 4, fw, bw, 5, lay, by);
    p->tensors[3].block_bytes = 800;
    p->tensors[3].density_rs = 0.3;
    p->tensors[3].density_ag = 0.6;
}

START_TEST(planners_on_chunks)
{
    dear_profile_t tp;
    chunk_model(&tp);
    dear_cost_model_t m;
    ck_assert_int_eq(dear_cost_preset("10gbe", 16, 1, &m), DEAR_OK);
    dear_tensor_desc_t *d;
    ck_assert_int_eq(dear_prof_descs(&tp, &d), DEAR_OK);
    /* whole (1 chunk each), the largest in 2, most in many */
    static const size_t parts[] = { 0, 160000, 9000 };
    static const int largest_chunks[] = { 1, 2, 34 };
    for (int pi = 0; pi < 3; pi++) {
        dear_unit_t *u = NULL;
        int nu;
        ck_assert_int_eq(dear_units_cut(5, d, parts[pi], &u, &nu), DEAR_OK);
        dear_profile_t up = { 0 };
        ck_assert_int_eq(dear_prof_units(&tp, nu, u, &up), DEAR_OK);
        ck_assert_int_eq(up.ntensors, nu);
        int lc = 0;
        for (int i = 0; i < nu; i++)
            lc += (u ? u[i].tensor : i) == 2;
        ck_assert_int_eq(lc, largest_chunks[pi]);
        for (int s = 0; s < DEAR_SCHED_COUNT; s++) {
            dear_sim_model_arg_t marg;
            dear_plan_problem_t prob;
            ck_assert_int_eq(dear_plan_problem_init(&prob, &up, (dear_sched_t)s, &m, 0, &marg), DEAR_OK);
            prob.threshold = 100000;
            double t[DEAR_PLANNER_COUNT];
            for (int k = 0; k < DEAR_PLANNER_COUNT; k++) {
                dear_plan_t pl = { 0 };
                ck_assert_int_eq(dear_plan_by_id(&pl, &prob, (dear_planner_t)k), DEAR_OK);
                ck_assert_int_eq(pl.nunits, nu);
                t[k] = sim_T(&up, &prob.cost, (dear_sched_t)s, &pl);
                ck_assert(isfinite(t[k]) && t[k] > 0);
                ck_assert_int_eq(dear_plan_set_units(&pl, 5, u), DEAR_OK);
                char msg[256];
                ck_assert_int_eq(dear_units_check(5, d, pl.nunits, pl.units, msg, sizeof msg), DEAR_OK);
                if (k == DEAR_PLANNER_NONE)
                    /* none: a bucket starts at every layer and at every chunk of a cut tensor */
                    for (int i = 1; i < nu; i++) {
                        int tt = u ? u[i].tensor : i, tp2 = u ? u[i - 1].tensor : i - 1;
                        int cut_i = u && u[i].bytes > 0, cut_p = u && u[i - 1].bytes > 0;
                        int want = d[tt].layer != d[tp2].layer || cut_i || cut_p;
                        ck_assert_int_eq(group_of(&pl.rs, i) != group_of(&pl.rs, i - 1),
                                         want);
                    }
                if (k == DEAR_PLANNER_THRESHOLD)
                    /* threshold: walking backward, a bucket closes at the threshold */
                    for (int g = 1; g < pl.rs.ngroups; g++) {
                        size_t b = 0, last_less = 0;
                        for (int i = pl.rs.first[g + 1] - 1; i >= pl.rs.first[g]; i--) {
                            last_less = b;
                            b += up.tensors[i].bytes;
                        }
                        ck_assert(b >= prob.threshold && last_less < prob.threshold);
                    }
                dear_plan_free(&pl);
            }
            /* auto: no worse than any planner it compares (for dear per phase, so no worse still) */
            for (int k = 0; k < DEAR_PLANNER_COUNT; k++)
                if (dear_planner_flags((dear_planner_t)k) & DEAR_PLANNER_F_CANDIDATE)
                    ck_assert_msg(t[DEAR_PLANNER_AUTO] <= t[k] * (1 + 1e-12), "partition %zu sched %d: auto %.9g, %s %.9g",
                                  parts[pi], s, t[DEAR_PLANNER_AUTO], dear_planner_name((dear_planner_t)k), t[k]);
        }
        /* Left whole, the units are the tensors: the same plans as on the profile itself. */
        if (pi == 0) {
            ck_assert_ptr_null(u);
            dear_sim_model_arg_t marg, marg2;
            dear_plan_problem_t a, b;
            ck_assert_int_eq(dear_plan_problem_init(&a, &up, DEAR_SCHED_DEAR, &m, 0, &marg), DEAR_OK);
            ck_assert_int_eq(dear_plan_problem_init(&b, &tp, DEAR_SCHED_DEAR, &m, 0, &marg2), DEAR_OK);
            dear_plan_t x = { 0 }, y = { 0 };
            ck_assert_int_eq(dear_plan_auto(&x, &a), DEAR_OK);
            ck_assert_int_eq(dear_plan_auto(&y, &b), DEAR_OK);
            ck_assert(dear_plan_equal(&x, &y));
            dear_plan_free(&x);
            dear_plan_free(&y);
        }
        dear_prof_free(&up);
        free(u);
    }
    /* A frozen tensor priced at 1 byte gives each of its chunks 1 byte. */
    dear_unit_t *u = NULL;
    int nu;
    ck_assert_int_eq(dear_units_cut(5, d, 9000, &u, &nu), DEAR_OK);
    tp.tensors[2].bytes = 1;
    dear_profile_t up = { 0 };
    ck_assert_int_eq(dear_prof_units(&tp, nu, u, &up), DEAR_OK);
    for (int i = 0; i < nu; i++)
        if (u[i].tensor == 2)
            ck_assert_uint_eq(up.tensors[i].bytes, 1);
    dear_prof_free(&up);
    free(u);
    free(d);
    dear_prof_free(&tp);
}
END_TEST

/* ---- plan files ---- */

START_TEST(planfile_round_trip_and_refusal)
{
    dear_tensor_desc_t t[5] = { { .bytes = 100, .layer = 0 }, { .bytes = 200, .layer = 1 }, { .bytes = 300, .layer = 1 },
                                { .bytes = 50, .layer = 2 }, { .bytes = 7, .layer = 4 } };
    const char *names[5] = { "a", "b", "c", "d", "e" };
    int rs[4] = { 0, 1, 3, 5 }, ag[3] = { 0, 4, 5 };
    dear_plan_t pl, back = { 0 };
    plan2(&pl, 5, 3, rs, 2, ag);
    snprintf(pl.planner, sizeof pl.planner, "dp");
    const char *path = tmpfile_path("x.plan");
    ck_assert_int_eq(dear_planfile_save(path, &pl, t, names), DEAR_OK);
    ck_assert_int_eq(dear_planfile_load(path, 5, t, names, &back), DEAR_OK);
    ck_assert(dear_plan_equal(&pl, &back));
    ck_assert_str_eq(back.planner, "dp");
    /* Wrong count. */
    capture();
    ck_assert_int_eq(dear_planfile_load(path, 4, t, names, &back), DEAR_ERR_MISMATCH);
    ck_assert_msg(strstr(logbuf, "made for 5 tensors, 4 are registered") != NULL, "%s", logbuf);
    /* One tensor of another size: named. */
    logbuf[0] = '\0';
    dear_tensor_desc_t t2[5];
    memcpy(t2, t, sizeof t);
    t2[2].bytes = 301;
    ck_assert_int_eq(dear_planfile_load(path, 5, t2, names, &back), DEAR_ERR_MISMATCH);
    ck_assert_msg(strstr(logbuf, "tensor 2") && strstr(logbuf, "'c'") && strstr(logbuf, "301"), "%s", logbuf);
    /* Another name. */
    logbuf[0] = '\0';
    const char *names2[5] = { "a", "b", "c", "dd", "e" };
    ck_assert_int_eq(dear_planfile_load(path, 5, t, names2, &back), DEAR_ERR_MISMATCH);
    ck_assert(strstr(logbuf, "'dd'") != NULL);
    /* Malformed: group starts out of order, and truncation. */
    logbuf[0] = '\0';
    write_file(path, "dear-plan 1\nplanner x\ntensors 5\nrs 2 0 6\nag 1 0\nend\n");
    ck_assert_int_eq(dear_planfile_load(path, 5, NULL, NULL, &back), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(logbuf, "x.plan:4:") != NULL, "%s", logbuf);
    logbuf[0] = '\0';
    write_file(path, "dear-plan 1\nplanner x\ntensors 5\nrs 2 0 3\nag 1 0\n");
    ck_assert_int_eq(dear_planfile_load(path, 5, NULL, NULL, &back), DEAR_ERR_FORMAT);
    ck_assert(strstr(logbuf, "truncated") != NULL);
    /* Early all-gather groups: more than the groups, or before the groups, are refused. */
    logbuf[0] = '\0';
    write_file(path, "dear-plan 1\nplanner x\ntensors 5\nrs 2 0 3\nag 2 0 4\nearly 3\nend\n");
    ck_assert_int_eq(dear_planfile_load(path, 5, NULL, NULL, &back), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(logbuf, "x.plan:6:") && strstr(logbuf, "COUNT in 0..2"), "%s", logbuf);
    logbuf[0] = '\0';
    write_file(path, "dear-plan 1\nplanner x\ntensors 5\nrs 2 0 3\nearly 1\nag 2 0 4\nend\n");
    ck_assert_int_eq(dear_planfile_load(path, 5, NULL, NULL, &back), DEAR_ERR_FORMAT);
    ck_assert_msg(strstr(logbuf, "'early' before the 'ag' line") != NULL, "%s", logbuf);
    uncapture();
    /* Still intact after the refusals. */
    ck_assert(dear_plan_equal(&pl, &back));
    /* And they round-trip; a plan differing only in them is another plan. */
    pl.ag_early = 1;
    ck_assert(!dear_plan_equal(&pl, &back));
    ck_assert_int_eq(dear_planfile_save(path, &pl, t, names), DEAR_OK);
    ck_assert_int_eq(dear_planfile_load(path, 5, t, names, &back), DEAR_OK);
    ck_assert_int_eq(back.ag_early, 1);
    ck_assert(dear_plan_equal(&pl, &back));
    /* Early groups that are not a trailing run: listed by index ('early-groups'), read back as
     * marks; a file listing a trailing run reads back as a count. */
    unsigned char first[2] = { 1, 0 };
    ck_assert_int_eq(dear_plan_set_early(&pl, first), DEAR_OK);
    ck_assert_int_eq(dear_planfile_save(path, &pl, t, names), DEAR_OK);
    ck_assert_int_eq(dear_planfile_load(path, 5, t, names, &back), DEAR_OK);
    ck_assert(back.early != NULL && back.ag_early == 1 && dear_plan_is_early(&back, 0) && dear_plan_equal(&pl, &back));
    write_file(path, "dear-plan 2\nplanner x\ntensors 5\nunits 5\nrs 2 0 3\nag 2 0 4\nearly-groups 1 1\nend\n");
    ck_assert_int_eq(dear_planfile_load(path, 5, NULL, NULL, &back), DEAR_OK);
    ck_assert(back.early == NULL && back.ag_early == 1);
    /* Malformed lists: out of range, not increasing, too few or too many, beside 'early'. */
    static const char *const bad[][2] = {
        { "early-groups 1 2", "group 0 is '2', expected a group index in 0..1" },
        { "early-groups 2 1 0", "group 1 is '0', expected a group index in 2..1" },
        { "early-groups 2 0", "group 1 is 'missing'" },
        { "early-groups 1 0 1", "lists more than its 1 groups" },
        { "early-groups 3 0 1 1", "COUNT in 0..2" },
        { "early 1\nearly-groups 1 0", "expected one 'early' or 'early-groups" },
    };
    capture();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "dear-plan 2\nplanner x\ntensors 5\nunits 5\nrs 2 0 3\nag 2 0 4\n%s\nend\n",
                 bad[i][0]);
        write_file(path, text);
        logbuf[0] = '\0';
        ck_assert_int_eq(dear_planfile_load(path, 5, NULL, NULL, &back), DEAR_ERR_FORMAT);
        ck_assert_msg(strstr(logbuf, bad[i][1]) != NULL, "'%s': %s", bad[i][0], logbuf);
    }
    uncapture();
    ck_assert(back.early == NULL && back.ag_early == 1); /* intact */
    dear_plan_free(&pl);
    dear_plan_free(&back);
}
END_TEST


/* Load path against d (2 tensors) expecting rc, the log naming line `line` and saying `says`. */
static void refused(const char *path, const dear_tensor_desc_t *d, int rc, int line, const char *says)
{
    dear_plan_t back = { 0 };
    char where[64];
    snprintf(where, sizeof where, "x.plan:%d:", line);
    logbuf[0] = '\0';
    capture();
    ck_assert_int_eq(dear_planfile_load(path, 2, d, NULL, &back), rc);
    uncapture();
    ck_assert_msg(strstr(logbuf, where) && strstr(logbuf, says), "expected '%s' and '%s' in: %s", where, says, logbuf);
}

START_TEST(planfile_cuts)
{
    /* A partitioned plan round-trips, cuts and all. */
    dear_tensor_desc_t t[3] = { { .bytes = 4000, .layer = 0, .elem_bytes = 4 },
                                { .bytes = 1000, .layer = 1, .elem_bytes = 2 },
                                { .bytes = 6400, .layer = 2, .elem_bytes = 4, .row_bytes = 640 } };
    const char *names[3] = { "w0", "w1", "emb" };
    dear_unit_t *u = NULL;
    int nu = 0;
    ck_assert_int_eq(dear_units_cut(3, t, 1500, &u, &nu), DEAR_OK);
    ck_assert_int_eq(nu, 3 + 1 + 5);
    int rs[4] = { 0, 2, 5, nu }, ag[5] = { 0, 1, 3, 4, nu };
    dear_plan_t pl = { 0 }, back = { 0 };
    ck_assert_int_eq(dear_plan_set(&pl, nu, 3, rs, 4, ag, "dp"), DEAR_OK);
    ck_assert_int_eq(dear_plan_set_units(&pl, 3, u), DEAR_OK);
    pl.ag_early = 2;
    const char *path = tmpfile_path("x.plan");
    ck_assert_int_eq(dear_planfile_save(path, &pl, t, names), DEAR_OK);
    ck_assert_int_eq(dear_planfile_load(path, 3, t, names, &back), DEAR_OK);
    ck_assert(dear_plan_equal(&pl, &back));
    ck_assert_int_eq(back.nunits, nu);
    /* and without the registered tensors (the cut lines carry the sizes) */
    ck_assert_int_eq(dear_planfile_load(path, 3, NULL, NULL, &back), DEAR_OK);
    ck_assert(dear_plan_equal(&pl, &back));
    FILE *f = fopen(path, "r");
    char text[2048];
    size_t got = fread(text, 1, sizeof text - 1, f);
    text[got] = '\0';
    fclose(f);
    ck_assert_msg(strstr(text, "dear-plan 2\n") && strstr(text, "\nunits 9\n") && strstr(text, "\ncut 0 4000 1280 2624\n") &&
                  strstr(text, "\ncut 2 6400 1280 2560 3840 5120\n") && !strstr(text, "\ncut 1 "), "%s", text);
    /* Registered with longer rows, the sparse tensor's cut at byte 1280 falls inside a row. */
    dear_tensor_desc_t t2[3];
    memcpy(t2, t, sizeof t);
    t2[2].row_bytes = 3200;
    capture();
    ck_assert_int_eq(dear_planfile_load(path, 3, t2, names, &back), DEAR_ERR_MISMATCH);
    uncapture();
    ck_assert_msg(strstr(logbuf, "inside a row of 3200 bytes"), "%s", logbuf);
    dear_plan_free(&pl);
    free(u);

    /* Version 1 is still read: every tensor whole. */
    write_file(path, "dear-plan 1\nplanner old\ntensors 2\nrs 2 0 1\nag 1 0\nend\n");
    ck_assert_int_eq(dear_planfile_load(path, 2, NULL, NULL, &back), DEAR_OK);
    ck_assert_ptr_null(back.units);
    ck_assert_int_eq(back.nunits, 2);
    ck_assert_int_eq(back.ntensors, 2);
    ck_assert_str_eq(back.planner, "old");
    dear_plan_free(&back);

    /* Cuts that cannot be: each refused at its line, saying why. A 16-bit tensor of 1000 bytes and
     * a sparse one of 1200 bytes in rows of 400. */
    dear_tensor_desc_t d[2] = { { .bytes = 1000, .layer = 0, .elem_bytes = 2 },
                                { .bytes = 1200, .layer = 1, .elem_bytes = 4, .row_bytes = 400 } };
#define HDR "dear-plan 2\nplanner x\ntensors 2\nunits 3\n"
#define HDR4 "dear-plan 2\nplanner x\ntensors 2\nunits 4\n"
#define TAIL "rs 1 0\nag 1 0\nend\n"
    static const struct {
        const char *text;
        int rc, line;
        const char *says;
    } bad[] = {
        { HDR "cut 0 1000 501\n" TAIL, DEAR_ERR_MISMATCH, 5, "inside an element of 2 bytes" },
        { HDR "cut 1 1200 600\n" TAIL, DEAR_ERR_MISMATCH, 5, "inside a row of 400 bytes" },
        { HDR "cut 0 1000 1000\n" TAIL, DEAR_ERR_FORMAT, 5, "not a byte offset inside it" },
        { HDR "cut 0 1000 0\n" TAIL, DEAR_ERR_FORMAT, 5, "not a byte offset inside it" },
        { HDR4 "cut 0 1000 600 400\n" TAIL, DEAR_ERR_FORMAT, 5, "must strictly increase" },
        { HDR4 "cut 0 1000 400 400\n" TAIL, DEAR_ERR_FORMAT, 5, "must strictly increase" },
        { HDR4 "cut 1 1200 400\ncut 0 1000 500\n" TAIL, DEAR_ERR_FORMAT, 6, "in tensor order" },
        { HDR "cut 0 1002 500\n" TAIL, DEAR_ERR_MISMATCH, 5, "the registered tensor has 1000" },
        { HDR "cut 0 1000 200 400\n" TAIL, DEAR_ERR_FORMAT, 5, "more units than the 3" },
        { HDR4 "cut 0 1000 500\n" TAIL, DEAR_ERR_FORMAT, 6, "the cut lines make 3 units" },
        { "dear-plan 2\nplanner x\ntensors 2\ntensor 0 a 0 1000\ntensor 1 b 1 1200\nunits 3\ncut 0 998 500\n" TAIL,
          DEAR_ERR_FORMAT, 7, "its 'cut' line says 998" },
        { "dear-plan 1\nplanner x\ntensors 2\ncut 0 1000 500\n" TAIL, DEAR_ERR_FORMAT, 4, "version 2 record" },
        { "dear-plan 3\n", DEAR_ERR_FORMAT, 1, "versions 1 and 2" },
        { "dear-plan 2\nplanner x\ntensors 2\n" TAIL, DEAR_ERR_FORMAT, 4, "before the 'units COUNT' line" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(path, bad[i].text);
        refused(path, d, bad[i].rc, bad[i].line, bad[i].says);
    }
#undef HDR
#undef HDR4
#undef TAIL
    /* A good cut of both, and the groups then range over the units. */
    write_file(path, "dear-plan 2\nplanner x\ntensors 2\nunits 5\ncut 0 1000 500\ncut 1 1200 400 800\nrs 2 0 3\n"
                     "ag 3 0 2 4\nend\n");
    ck_assert_int_eq(dear_planfile_load(path, 2, d, NULL, &back), DEAR_OK);
    ck_assert_int_eq(back.nunits, 5);
    ck_assert_int_eq(back.units[3].tensor, 1);
    ck_assert_uint_eq(back.units[3].offset, 400);
    ck_assert_uint_eq(back.units[3].bytes, 400);
    ck_assert_int_eq(back.ag.ngroups, 3);
    dear_plan_free(&back);
}
END_TEST

/* ---- planner timing: a smoke bound so a regression to exponential time shows ---- */
START_TEST(planners_fast_on_2000_tensors)
{
    dear_profile_t p;
    dear_prof_init(&p, "big");
    for (int l = 0; l < 1000; l++)
        ck_assert_int_eq(dear_prof_add_layer(&p, l, 1e-4 * (1 + l % 7), 2e-4 * (1 + l % 5)), DEAR_OK);
    for (int t = 0; t < 2000; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        ck_assert_int_eq(dear_prof_add_tensor(&p, name, t / 2, 4096 * (size_t)(1 + (t * 7919) % 97)), DEAR_OK);
    }
    char msg[128];
    ck_assert_int_eq(dear_prof_check(&p, msg, sizeof msg), DEAR_OK);
    dear_cost_model_t m;
    ck_assert_int_eq(dear_cost_preset("10gbe", 16, 1, &m), DEAR_OK);
    dear_sim_model_arg_t marg;
    dear_plan_problem_t prob;
    ck_assert_int_eq(dear_plan_problem_init(&prob, &p, DEAR_SCHED_DEAR, &m, 0, &marg), DEAR_OK);
    dear_plan_t pl = { 0 };
    ck_assert_int_eq(dear_plan_dp(&pl, &prob), DEAR_OK);
    ck_assert_int_eq(dear_plan_mgwfbp(&pl, &prob), DEAR_OK);
    char err[256];
    ck_assert_int_eq(dear_plan_validate(&pl, 2000, err, sizeof err), DEAR_OK);
    dear_plan_free(&pl);
    dear_prof_free(&p);
}
END_TEST

/* ---- planning without a profile ---- */

/* Five layers (ids 10 * index): 0: 100 B; 1: 200 B, hint 1000; 2: a sparse 300 B tensor; 3: no
 * tensor; 4: 50 B, hint 0. */
static void five_layers(dear_profile_t *p, int hints)
{
    dear_prof_init(p, "five");
    for (int l = 0; l < 5; l++) {
        ck_assert_int_eq(dear_prof_add_layer(p, 10 * l, 0.001 * (l + 1), 0.002 * (l + 1)), DEAR_OK);
        if (hints && l == 1)
            dear_prof_set_flops(p, 1000);
        if (hints && l == 4)
            dear_prof_set_flops(p, 0);
    }
    ck_assert_int_eq(dear_prof_add_tensor(p, "a", 0, 100), DEAR_OK);
    ck_assert_int_eq(dear_prof_add_tensor(p, "b", 10, 200), DEAR_OK);
    ck_assert_int_eq(dear_prof_add_tensor(p, "emb", 20, 300), DEAR_OK);
    dear_prof_set_sparse(p, 100, 0.5, 0.5);
    ck_assert_int_eq(dear_prof_add_tensor(p, "d", 40, 50), DEAR_OK);
    char msg[256];
    ck_assert_int_eq(dear_prof_check(p, msg, sizeof msg), DEAR_OK);
}

START_TEST(estimate_costs_by_hand)
{
    dear_profile_t p;
    double c[5];
    /* No hint: dense parameter bytes; the sparse lookup and the tensorless layer cost nothing. */
    five_layers(&p, 0);
    ck_assert_int_eq(dear_estimate_costs(&p, c), DEAR_OK);
    const double bytes_only[5] = { 100, 200, 0, 0, 50 };
    for (int l = 0; l < 5; l++)
        ck_assert_double_eq_tol(c[l], bytes_only[l], 1e-12);
    dear_prof_free(&p);
    /* Hints on layers 1 and 4 (1000 FLOPs over 250 dense bytes): the others at 4 per byte. */
    five_layers(&p, 1);
    ck_assert_int_eq(dear_estimate_costs(&p, c), DEAR_OK);
    const double hinted[5] = { 400, 1000, 0, 0, 0 };
    for (int l = 0; l < 5; l++)
        ck_assert_double_eq_tol(c[l], hinted[l], 1e-9);
    /* The estimate spreads the totals by cost; every tensor, block and density kept. */
    dear_profile_t e = { 0 };
    ck_assert_int_eq(dear_prof_estimate(&p, 0.3, 0.7, &e), DEAR_OK);
    ck_assert_int_eq(e.nlayers, 5);
    ck_assert_int_eq(e.ntensors, 4);
    for (int l = 0; l < 5; l++) {
        ck_assert_double_eq_tol(e.layers[l].fwd_s, 0.3 * hinted[l] / 1400, 1e-12);
        ck_assert_double_eq_tol(e.layers[l].bwd_s, 0.7 * hinted[l] / 1400, 1e-12);
    }
    ck_assert_uint_eq(e.tensors[2].block_bytes, 100);
    ck_assert_double_eq(e.tensors[2].density_ag, 0.5);
    ck_assert_int_eq(e.tensors[2].lidx, 2);
    /* Every hint 0 and no bytes left to price: the totals spread evenly. */
    for (int l = 0; l < 5; l++)
        p.layers[l].flops = 0;
    ck_assert_int_eq(dear_prof_estimate(&p, 1.0, 2.0, &e), DEAR_OK);
    for (int l = 0; l < 5; l++)
        ck_assert_double_eq_tol(e.layers[l].bwd_s, 0.4, 1e-12);
    ck_assert_int_eq(dear_prof_estimate(&p, -1.0, 2.0, &e), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_prof_estimate(&p, NAN, 2.0, &e), DEAR_ERR_ARG);
    dear_prof_free(&e);
    dear_prof_free(&p);
}
END_TEST

START_TEST(estimate_model_descriptions)
{
    char path[512];
    snprintf(path, sizeof path, "%s", tmpfile_path("m.model"));
    write_file(path, "dear-model 1\nmodel m\nlayer 0 1e9\nlayer 3\nlayer 5 0\ntensor w 0 400\n"
                     "tensor e 3 800\nsparse e 80 1 1\ntensor v 5 4\nend 3 3\n");
    dear_profile_t p = { 0 }, q = { 0 };
    ck_assert_int_eq(dear_prof_load(path, &p), DEAR_OK);
    ck_assert_int_eq(p.no_times, 1);
    ck_assert_double_eq(p.layers[0].flops, 1e9);
    ck_assert(p.layers[1].flops < 0);
    ck_assert_double_eq(p.layers[2].flops, 0);
    ck_assert_double_eq(dear_prof_fwd_total(&p) + dear_prof_bwd_total(&p), 0);
    /* Written back as a description, read again the same. */
    ck_assert_int_eq(dear_prof_save(&p, tmpfile_path("again.model")), DEAR_OK);
    ck_assert_int_eq(dear_prof_load(tmpfile_path("again.model"), &q), DEAR_OK);
    ck_assert_int_eq(q.no_times, 1);
    ck_assert_int_eq(q.nlayers, 3);
    for (int l = 0; l < 3; l++)
        ck_assert_double_eq(q.layers[l].flops, p.layers[l].flops);
    ck_assert_uint_eq(q.tensors[1].block_bytes, 80);
    dear_prof_free(&q);
    /* Bad lines are named with what is accepted; a profile's layer line is not a description's. */
    static const struct {
        const char *text, *says;
    } bad[] = {
        { "dear-model 1\nlayer 0 -5\ntensor w 0 4\nend 1 1\n", ":2: expected 'layer ID [FLOPS]'" },
        { "dear-model 1\nlayer 0 0.1 0.2\ntensor w 0 4\nend 1 1\n", ":2: expected 'layer ID [FLOPS]'" },
        { "dear-model 1\nlayer 0 nan\ntensor w 0 4\nend 1 1\n", ":2: expected 'layer ID [FLOPS]'" },
        { "dear-profile 1\nlayer 0 5\ntensor w 0 4\nend 1 1\n", ":2: expected 'layer ID FORWARD_S BACKWARD_S'" },
        { "dear-modle 1\n", ":1: expected the header 'dear-profile 1' or 'dear-model 1'" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(path, bad[i].text);
        capture();
        ck_assert_int_eq(dear_prof_load(path, &q), DEAR_ERR_FORMAT);
        uncapture();
        ck_assert_msg(strstr(logbuf, bad[i].says) != NULL, "case %zu: %s", i, logbuf);
    }
    dear_prof_free(&p);
}
END_TEST

/* The shipped descriptions are the shipped profiles without times: the same layers and tensors,
 * and each layer's hint gives its profiled times (FLOPs x batch at the rate, plus the fixed cost
 * per layer, backward twice the FLOPs: fusion/profiles/gen.py). */
START_TEST(estimate_shipped_descriptions)
{
    static const char *models[] = { "resnet50", "vgg16", "densenet201", "bert-base", "gpt2-small",
                                    "gpt2-small-untied" };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[512];
        dear_profile_t p = { 0 }, m = { 0 };
        snprintf(path, sizeof path, "%s/fusion/profiles/%s.prof", DEAR_SRCDIR, models[i]);
        ck_assert_int_eq(dear_prof_load(path, &p), DEAR_OK);
        snprintf(path, sizeof path, "%s/fusion/profiles/%s.model", DEAR_SRCDIR, models[i]);
        ck_assert_int_eq(dear_prof_load(path, &m), DEAR_OK);
        ck_assert_int_eq(m.no_times, 1);
        ck_assert_int_eq(m.nlayers, p.nlayers);
        ck_assert_int_eq(m.ntensors, p.ntensors);
        double per_flop = NAN; /* batch / rate: one number for the whole model */
        for (int l = 0; l < p.nlayers; l++) {
            ck_assert_int_eq(m.layers[l].id, p.layers[l].id);
            ck_assert(m.layers[l].flops >= 0);
            if (m.layers[l].flops > 1e6 && isnan(per_flop))
                per_flop = (p.layers[l].fwd_s - 20e-6) / m.layers[l].flops;
            double fw = m.layers[l].flops * (isnan(per_flop) ? 0 : per_flop) + 20e-6;
            if (!isnan(per_flop)) {
                ck_assert_double_eq_tol(p.layers[l].fwd_s, fw, 1e-9 + 1e-6 * fw);
                ck_assert_double_eq_tol(p.layers[l].bwd_s, 2 * fw, 2e-9 + 1e-6 * fw);
            }
        }
        ck_assert(per_flop > 0);
        for (int t = 0; t < p.ntensors; t++) {
            ck_assert_str_eq(m.tensors[t].name, p.tensors[t].name);
            ck_assert_uint_eq(m.tensors[t].bytes, p.tensors[t].bytes);
            ck_assert_uint_eq(m.tensors[t].block_bytes, p.tensors[t].block_bytes);
        }
        dear_prof_free(&p);
        dear_prof_free(&m);
    }
}
END_TEST

/* Eight layers of uneven compute and sizes. */
static void eight_layers(dear_profile_t *p, double scale)
{
    static const double fw[8] = { 4, 1, 3, 1, 2, 6, 1, 2 };
    static const size_t by[8] = { 1000, 90000, 4000, 250000, 8000, 30000, 500, 400000 };
    dear_prof_init(p, "eight");
    for (int l = 0; l < 8; l++)
        ck_assert_int_eq(dear_prof_add_layer(p, l, scale * fw[l], 2 * scale * fw[l]), DEAR_OK);
    for (int l = 0; l < 8; l++) {
        char name[8];
        snprintf(name, sizeof name, "t%d", l);
        ck_assert_int_eq(dear_prof_add_tensor(p, name, l, by[l]), DEAR_OK);
    }
    char msg[256];
    ck_assert_int_eq(dear_prof_check(p, msg, sizeof msg), DEAR_OK);
}

/* The plan across the range is the candidate of least worst loss: recomputed here over profiles
 * built at each ratio from the arrays, not by scaling the estimate. */
START_TEST(estimate_robust_is_minimax)
{
    lin_arg_t l = lin(2e-3, 2e-8, 1e-3, 1e-8);
    dear_sched_t scheds[] = { DEAR_SCHED_DEAR, DEAR_SCHED_WFBP };
    for (int si = 0; si < 2; si++) {
        dear_profile_t base;
        eight_layers(&base, 1.0);
        dear_plan_problem_t prob = { .prof = &base, .sched = scheds[si], .cost = { lin_cost, &l, NULL }, .threshold = 100000 };
        for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
            prob.alpha[op] = l.alpha[op], prob.beta[op] = l.beta[op];
        double comm = dear_estimate_comm_s(&prob, &base);
        ck_assert_double_eq_tol(comm, 2e-3 + 2e-8 * 783500, 1e-12); /* RS + AG, or the all-reduce */
        dear_robust_range_t rg = { 0.25, 4, 3 };
        double regret = 0;
        dear_plan_t got = { 0 };
        ck_assert_int_eq(dear_plan_robust(&got, &prob, DEAR_PLANNER_MGWFBP, &rg, &regret), DEAR_OK);
        ck_assert(strncmp(got.planner, "est:", 4) == 0);
        /* Candidates and times at ratios 1/4, 1, 4 (compute 60 units of scale s: s = r comm / 60). */
        dear_profile_t at[3];
        dear_plan_t cand[3] = { { 0 } };
        double t[3][3], best[3] = { INFINITY, INFINITY, INFINITY };
        for (int i = 0; i < 3; i++) {
            eight_layers(&at[i], (0.25 * pow(4, i)) * comm / 60);
            dear_plan_problem_t p = prob;
            p.prof = &at[i];
            ck_assert_int_eq(dear_plan_mgwfbp(&cand[i], &p), DEAR_OK);
        }
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                dear_sim_result_t r = { 0 };
                ck_assert_int_eq(dear_sim_run(&at[j], &prob.cost, prob.sched, &cand[i], 0, &r), DEAR_OK);
                t[i][j] = r.iter_s;
                best[j] = fmin(best[j], r.iter_s);
            }
        double least = INFINITY, got_worst = 0;
        for (int i = 0; i < 3; i++) {
            double w = 0;
            for (int j = 0; j < 3; j++)
                w = fmax(w, t[i][j] / best[j]);
            least = fmin(least, w);
        }
        for (int j = 0; j < 3; j++) {
            dear_sim_result_t r = { 0 };
            ck_assert_int_eq(dear_sim_run(&at[j], &prob.cost, prob.sched, &got, 0, &r), DEAR_OK);
            got_worst = fmax(got_worst, r.iter_s / best[j]);
        }
        ck_assert_double_eq_tol(regret, least, 1e-9);
        ck_assert_double_eq_tol(got_worst, least, 1e-9);
        ck_assert(least >= 1.0);
        /* One point: the planner's plan at the range's geometric mean (ratio 1). */
        dear_robust_range_t one = { 0.25, 4, 1 };
        ck_assert_int_eq(dear_plan_robust(&got, &prob, DEAR_PLANNER_MGWFBP, &one, &regret), DEAR_OK);
        ck_assert(dear_plan_equal(&got, &cand[1]));
        ck_assert_double_eq(regret, 1.0);
        /* A bad range is refused. */
        dear_robust_range_t bad = { 0, 4, 3 };
        ck_assert_int_eq(dear_plan_robust(&got, &prob, DEAR_PLANNER_MGWFBP, &bad, NULL), DEAR_ERR_ARG);
        for (int i = 0; i < 3; i++) {
            dear_plan_free(&cand[i]);
            dear_prof_free(&at[i]);
        }
        dear_plan_free(&got);
        dear_prof_free(&base);
    }
}
END_TEST

/* Every shipped model, planned from its description alone (hints, the scale from its profile's
 * totals as a first iteration gives it, or across the range the runtime plans for), predicted on
 * its profile: within the goal of 5% of the plan made from the profile itself, under the 10gbe
 * preset at P = 4, at the profile's own times and with them scaled to compute = communication
 * (the e2e matrix's balanced cases, where the plans for different scales differ most). */
START_TEST(estimate_shipped_close_to_profiled)
{
    static const char *models[] = { "resnet50", "vgg16", "densenet201", "bert-base", "gpt2-small" };
    dear_cost_model_t cm;
    ck_assert_int_eq(dear_cost_preset("10gbe", 4, 1, &cm), DEAR_OK);
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        for (int balanced = 0; balanced < 2; balanced++) {
            char path[512];
            dear_profile_t p = { 0 }, m = { 0 }, e = { 0 };
            snprintf(path, sizeof path, "%s/fusion/profiles/%s.prof", DEAR_SRCDIR, models[i]);
            ck_assert_int_eq(dear_prof_load(path, &p), DEAR_OK);
            snprintf(path, sizeof path, "%s/fusion/profiles/%s.model", DEAR_SRCDIR, models[i]);
            ck_assert_int_eq(dear_prof_load(path, &m), DEAR_OK);
            dear_sim_model_arg_t ma, me;
            dear_plan_problem_t pp, pe;
            ck_assert_int_eq(dear_plan_problem_init(&pp, &p, DEAR_SCHED_DEAR, &cm, 0, &ma), DEAR_OK);
            if (balanced) {
                double f = dear_estimate_comm_s(&pp, &p) / (dear_prof_fwd_total(&p) + dear_prof_bwd_total(&p));
                for (int l = 0; l < p.nlayers; l++)
                    p.layers[l].fwd_s *= f, p.layers[l].bwd_s *= f;
                ck_assert_int_eq(dear_plan_problem_init(&pp, &p, DEAR_SCHED_DEAR, &cm, 0, &ma), DEAR_OK);
            }
            ck_assert_int_eq(dear_prof_estimate(&m, dear_prof_fwd_total(&p), dear_prof_bwd_total(&p), &e), DEAR_OK);
            ck_assert_int_eq(dear_plan_problem_init(&pe, &e, DEAR_SCHED_DEAR, &cm, 0, &me), DEAR_OK);
            dear_plan_t ref = { 0 }, first = { 0 }, range = { 0 };
            ck_assert_int_eq(dear_plan_dp(&ref, &pp), DEAR_OK);
            ck_assert_int_eq(dear_plan_dp(&first, &pe), DEAR_OK);
            dear_robust_range_t rg = { DEAR_ROBUST_LO, DEAR_ROBUST_HI, DEAR_ROBUST_POINTS };
            ck_assert_int_eq(dear_plan_robust(&range, &pe, DEAR_PLANNER_DP, &rg, NULL), DEAR_OK);
            dear_sim_result_t r[3] = { { 0 } };
            ck_assert_int_eq(dear_sim_run(&p, &pp.cost, DEAR_SCHED_DEAR, &ref, 0, &r[0]), DEAR_OK);
            ck_assert_int_eq(dear_sim_run(&p, &pp.cost, DEAR_SCHED_DEAR, &first, 0, &r[1]), DEAR_OK);
            ck_assert_int_eq(dear_sim_run(&p, &pp.cost, DEAR_SCHED_DEAR, &range, 0, &r[2]), DEAR_OK);
            double tr = r[0].iter_s, tf = r[1].iter_s, tg = r[2].iter_s;
            /* range trades the middle for the ends: balanced, its least worst-case loss across
             * the ratios can pass the goal (bert-base under this preset, docs/PERFORMANCE.md),
             * so range is guarded at 6% there; first knows the scale. */
            double range_goal = balanced ? 1.06 : 1.05;
            ck_assert_msg(tf <= 1.05 * tr && tg <= range_goal * tr,
                          "%s%s: profiled %.3f ms, first %.3f ms, range %.3f ms (%d buckets)", models[i],
                          balanced ? " (compute = communication)" : "", 1e3 * tr, 1e3 * tf, 1e3 * tg,
                          range.rs.ngroups);
            dear_plan_free(&ref);
            dear_plan_free(&first);
            dear_plan_free(&range);
            dear_prof_free(&p);
            dear_prof_free(&m);
            dear_prof_free(&e);
        }
}
END_TEST

/* dear_first_start's gain against the same figure made by hand: the description's estimate
 * with every layer's times scaled so compute is `ratio` x one reduce-scatter and one all-gather
 * of every gradient, both plans simulated on it. */
START_TEST(estimate_gain_by_hand)
{
    static const char *models[] = { "resnet50", "bert-base" };
    dear_cost_model_t cm;
    ck_assert_int_eq(dear_cost_preset("10gbe", 4, 1, &cm), DEAR_OK);
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char path[512];
        dear_profile_t m = { 0 }, e = { 0 };
        snprintf(path, sizeof path, "%s/fusion/profiles/%s.model", DEAR_SRCDIR, models[i]);
        ck_assert_int_eq(dear_prof_load(path, &m), DEAR_OK);
        ck_assert_int_eq(dear_prof_estimate(&m, 1.0, 2.0, &e), DEAR_OK);
        dear_sim_model_arg_t me;
        dear_plan_problem_t pe;
        ck_assert_int_eq(dear_plan_problem_init(&pe, &e, DEAR_SCHED_DEAR, &cm, 0, &me), DEAR_OK);
        pe.threshold = 25u << 20;
        dear_plan_t range = { 0 }, thr = { 0 };
        dear_robust_range_t rg = { DEAR_ROBUST_LO, DEAR_ROBUST_HI, DEAR_ROBUST_POINTS };
        ck_assert_int_eq(dear_plan_robust(&range, &pe, DEAR_PLANNER_DP, &rg, NULL), DEAR_OK);
        ck_assert_int_eq(dear_plan_by_id(&thr, &pe, DEAR_PLANNER_THRESHOLD), DEAR_OK);
        size_t bytes = 0;
        for (int t = 0; t < e.ntensors; t++)
            bytes += e.tensors[t].bytes;
        double comm = pe.cost.fn(pe.cost.arg, DEAR_COLL_REDUCE_SCATTER, bytes) +
                      pe.cost.fn(pe.cost.arg, DEAR_COLL_ALLGATHER, bytes);
        static const double ratios[] = { 0.25, 1.0, 3.0 };
        for (int k = 0; k < 3; k++) {
            dear_profile_t at = { 0 };
            ck_assert_int_eq(dear_prof_copy(&e, &at), DEAR_OK);
            double f = ratios[k] * comm / 3.0; /* the estimate's compute totals 1 + 2 */
            for (int l = 0; l < at.nlayers; l++)
                at.layers[l].fwd_s *= f, at.layers[l].bwd_s *= f;
            dear_sim_result_t ra = { 0 }, rb = { 0 };
            ck_assert_int_eq(dear_sim_run(&at, &pe.cost, DEAR_SCHED_DEAR, &range, 0, &ra), DEAR_OK);
            ck_assert_int_eq(dear_sim_run(&at, &pe.cost, DEAR_SCHED_DEAR, &thr, 0, &rb), DEAR_OK);
            dear_first_start_t gs, self;
            ck_assert_int_eq(dear_first_start(&pe, &range, &thr, ratios[k], 0, 0, &gs), DEAR_OK);
            ck_assert_msg(fabs(gs.gain - (1 - ra.iter_s / rb.iter_s)) < 1e-12, "%s at %g: gain %.15g, by hand %.15g",
                          models[i], ratios[k], gs.gain, 1 - ra.iter_s / rb.iter_s);
            ck_assert_int_eq(dear_first_start(&pe, &thr, &thr, ratios[k], 0, 0, &self), DEAR_OK);
            ck_assert_double_eq(self.gain, 0);
            /* dear_first_start: the same two predictions, and the threshold plan exactly where the
             * hand-made gain is under the margin (a margin just above it, then just below). */
            double hand = 1 - ra.iter_s / rb.iter_s;
            for (int side = 0; side < 2; side++) {
                dear_first_start_t st;
                double margin = side ? hand - 1e-6 : hand + 1e-6;
                ck_assert_int_eq(dear_first_start(&pe, &range, &thr, ratios[k], margin, 0, &st), DEAR_OK);
                ck_assert_msg(fabs(st.plan_s - ra.iter_s) < 1e-12 && fabs(st.thr_s - rb.iter_s) < 1e-12,
                              "%s at %g: start predicted %.15g/%.15g, by hand %.15g/%.15g", models[i], ratios[k],
                              st.plan_s, st.thr_s, ra.iter_s, rb.iter_s);
                ck_assert_int_eq(st.threshold, !side);
                ck_assert_int_eq(dear_first_start(&pe, &range, &thr, ratios[k], margin, 1, &st), DEAR_OK);
                ck_assert_int_eq(st.threshold, 0); /* the same plan: nothing to start instead */
            }
            dear_prof_free(&at);
        }
        dear_first_start_t g = { .gain = 7 };
        ck_assert_int_eq(dear_first_start(&pe, &range, &thr, -1, 0, 0, &g), DEAR_ERR_ARG);
        ck_assert_int_eq(dear_first_start(&pe, &range, &thr, NAN, 0, 0, &g), DEAR_ERR_ARG);
        ck_assert_int_eq(dear_first_start(&pe, &range, NULL, 1, 0, 0, &g), DEAR_ERR_ARG);
        ck_assert_double_eq(g.gain, 7); /* untouched on error */
        /* Ratio 0: at the estimate's own times, as simulated directly. */
        dear_first_start_t st;
        dear_sim_result_t ra = { 0 }, rb = { 0 };
        ck_assert_int_eq(dear_sim_run(&e, &pe.cost, DEAR_SCHED_DEAR, &range, 0, &ra), DEAR_OK);
        ck_assert_int_eq(dear_sim_run(&e, &pe.cost, DEAR_SCHED_DEAR, &thr, 0, &rb), DEAR_OK);
        ck_assert_int_eq(dear_first_start(&pe, &range, &thr, 0, 0.1, 0, &st), DEAR_OK);
        ck_assert(fabs(st.plan_s - ra.iter_s) < 1e-12 && fabs(st.thr_s - rb.iter_s) < 1e-12);
        ck_assert_int_eq(st.threshold, !(1 - ra.iter_s / rb.iter_s >= 0.1));
        ck_assert_int_eq(dear_first_start(&pe, &range, &thr, -1, 0.1, 0, &st), DEAR_ERR_ARG);
        /* An unknown prediction starts on the threshold plan. */
        ck_assert_int_eq(dear_first_start_decide(NAN, 1.0, 0.1, 0).threshold, 1);
        ck_assert_int_eq(dear_first_start_decide(0.5, NAN, 0.1, 0).threshold, 1);
        ck_assert_int_eq(dear_first_start_decide(0.8, 1.0, 0.1, 0).threshold, 0);
        dear_plan_free(&range);
        dear_plan_free(&thr);
        dear_prof_free(&m);
        dear_prof_free(&e);
    }
}
END_TEST

static Suite *fusion_suite(void)
{
    Suite *s = suite_create("fusion");
    TCase *tc = tcase_create("cost");
    tcase_add_test(tc, cost_fit_recovers_line);
    tcase_add_test(tc, cost_presets_and_scaling);
    tcase_add_test(tc, cost_per_size_switch);
    tcase_add_test(tc, cost_file_round_trip);
    tcase_add_test(tc, cost_curve);
    tcase_add_test(tc, cost_format_curves);
    tcase_add_test(tc, cost_burst_curves);
    tcase_add_test(tc, cost_idle_curves);
    tcase_add_test(tc, cost_fit_to_training);
    suite_add_tcase(s, tc);
    tc = tcase_create("profile");
    tcase_add_test(tc, profile_round_trip);
    tcase_add_test(tc, profile_shipped);
    tcase_add_test(tc, profile_bad_lines);
    suite_add_tcase(s, tc);
    tc = tcase_create("sim");
    tcase_add_test(tc, sim_sync_and_wfbp_by_hand);
    tcase_add_test(tc, sim_dear_by_hand);
    tcase_add_test(tc, sim_dear_early_by_hand);
    tcase_add_test(tc, sim_dear_early_stepped_by_hand);
    tcase_add_test(tc, sim_dear_sharded_steps_by_hand);
    tcase_add_test(tc, sim_dear_layers_without_tensors);
    tcase_add_test(tc, sim_queued_by_hand);
    tcase_add_test(tc, sim_idle_by_hand);
    suite_add_tcase(s, tc);
    tc = tcase_create("planners");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, mgwfbp_hand_worked);
    tcase_add_test(tc, dp_equals_brute_force);
    tcase_add_test(tc, sim_sparse_by_hand);
    tcase_add_test(tc, sim_compress_by_hand);
    tcase_add_test(tc, profile_sparse_round_trip);
    tcase_add_test(tc, dp_split_equals_brute_force);
    tcase_add_test(tc, sim_early_marks);
    tcase_add_test(tc, auto_early_any_groups);
    tcase_add_test(tc, auto_refines_every_pairing);
    tcase_add_test(tc, plan_early_marks);
    tcase_add_test(tc, dp_search_equals_best_split);
    tcase_add_test(tc, gradssa_deterministic_and_never_worse);
    tcase_add_test(tc, gradssa_within_1pct_of_dp_on_shipped);
    tcase_add_test(tc, auto_runners_up);
    tcase_add_test(tc, auto_tied_plan);
    tcase_add_test(tc, auto_ties_fewest_collectives);
    tcase_add_test(tc, no_early_plans);
    tcase_add_test(tc, planners_fast_on_2000_tensors);
    suite_add_tcase(s, tc);
    tc = tcase_create("units");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, units_cut_rules);
    tcase_add_test(tc, units_check_refuses_bad_cuts);
    tcase_add_test(tc, planners_on_chunks);
    suite_add_tcase(s, tc);
    tc = tcase_create("planfile");
    tcase_add_test(tc, planfile_round_trip_and_refusal);
    tcase_add_test(tc, planfile_cuts);
    suite_add_tcase(s, tc);
    tc = tcase_create("estimate");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, estimate_costs_by_hand);
    tcase_add_test(tc, estimate_model_descriptions);
    tcase_add_test(tc, estimate_shipped_descriptions);
    tcase_add_test(tc, estimate_robust_is_minimax);
    tcase_add_test(tc, estimate_shipped_close_to_profiled);
    tcase_add_test(tc, estimate_gain_by_hand);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    make_tmpdir();   /* before the forks, so the parent can remove it */
    SRunner *sr = srunner_create(fusion_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (tmpdir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return failed ? 1 : 0;
}

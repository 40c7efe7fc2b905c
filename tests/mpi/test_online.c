/*
 * Online planning and calibration in the runtime, under mpirun -np 2 and 4 (Check, CK_FORK=no).
 *
 * A synthetic model of 30 tensors in 16 layers (float32 with a few float64, one gradient arena
 * with gaps so some buckets are zero-copy and some use fusion buffers) is trained with SGD while
 * the runtime switches plans: the warm-up plan is the threshold plan with a 1-byte cap (one
 * bucket per tensor), then every model-driven planner re-plans after 2 iterations and every 3
 * after that. Gradients are integer-valued with rank offsets that sum to zero, so the parameters
 * must equal, bit for bit, a reference loop with one MPI_Allreduce per tensor. Also checked: every
 * rank ends on the same plan, the plan really changed, updates still run at the documented hook;
 * the calibration cache is written, then used without measuring (ctx->calib_measured), a
 * corrupt cache is reported, kept as PATH.corrupt, measured again and replaced; DEAR_CALIBRATE=off
 * takes each DEAR_COST_PRESET; auto's measured check (DEAR_VERIFY_ITERS) goes back to the
 * replaced plan when that one ran faster and keeps the new one otherwise.
 */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fusion/planfile.h"
#include "include/dear.h"
#include "runtime/log.h"
#include "tests/mpi/synth.h"
#include "runtime/rt.h"

#define NT 30
#define ITERS 12

static int rank, nranks;

/* ---- the model ---- */

typedef struct {
    tensor_t t[NT];
    void *arena;
    int nlayers, layer_ids[NT], lfirst[NT], llast[NT];
} model_t;

static void model_init(model_t *m)
{
    memset(m, 0, sizeof *m);
    size_t total = 0;
    for (int i = 0; i < NT; i++) {
        tensor_t *t = &m->t[i];
        snprintf(t->name, sizeof t->name, "t%02d", i);
        t->layer = 3 + i / 2 + (i > 20 ? i - 20 : 0);
        t->count = i == 9 ? 65537 : i == 22 ? 200001 : 1 + (size_t)((i * 53) % 3000);
        t->dtype = i % 11 == 4 ? DEAR_FLOAT64 : DEAR_FLOAT32;
        total += t->count * esize(t->dtype) + 16;
    }
    m->arena = calloc(1, total);
    ck_assert_ptr_nonnull(m->arena);
    size_t off = 0;
    for (int i = 0; i < NT; i++) {
        tensor_t *t = &m->t[i];
        if (t->dtype == DEAR_FLOAT64 || i % 7 == 3)
            off = (off + 15) & ~(size_t)7; /* a gap: the bucket holding it needs a fusion buffer */
        t->grad = (char *)m->arena + off;
        off += t->count * esize(t->dtype);
        t->param = calloc(t->count, esize(t->dtype));
        ck_assert_ptr_nonnull(t->param);
        for (size_t j = 0; j < t->count; j++) {
            double v = (double)((i * 5 + (int)j) % 13) - 6;
            if (t->dtype == DEAR_FLOAT64)
                ((double *)t->param)[j] = v;
            else
                ((float *)t->param)[j] = (float)v;
        }
    }
    for (int i = 0; i < NT; i++) {
        if (i == 0 || m->t[i].layer != m->t[i - 1].layer) {
            m->layer_ids[m->nlayers] = m->t[i].layer;
            m->lfirst[m->nlayers++] = i;
        }
        m->llast[m->nlayers - 1] = i;
    }
}

static void model_free(model_t *m)
{
    for (int i = 0; i < NT; i++)
        free(m->t[i].param);
    free(m->arena);
}

/* Integer-valued, depends on the parameter (so a wrong update shows later); the rank offsets
 * 2*rank - (P-1) sum to zero, so the average is exact. */
static void compute_grads(model_t *m, int i, int k, void *dst)
{
    tensor_t *t = &m->t[i];
    for (size_t j = 0; j < t->count; j++) {
        double p = t->dtype == DEAR_FLOAT64 ? ((double *)t->param)[j] : ((float *)t->param)[j];
        long long v = ((long long)j * 3 + i * 7 + k * 11 + (long long)p) % 9;
        if (v < 0)
            v += 9;
        double g = (double)(v - 4) + 2.0 * rank - (nranks - 1);
        if (t->dtype == DEAR_FLOAT64)
            ((double *)dst)[j] = g;
        else
            ((float *)dst)[j] = (float)g;
    }
}

static void reference_train(model_t *m, int iters)
{
    for (int k = 0; k < iters; k++)
        for (int i = NT - 1; i >= 0; i--) {
            tensor_t *t = &m->t[i];
            compute_grads(m, i, k, t->grad);
            reference_step(t, nranks);
        }
}

static void register_model(dear_ctx_t *ctx, model_t *m)
{
    for (int i = 0; i < NT; i++) {
        tensor_t *t = &m->t[i];
        ck_assert_int_eq(dear_register(ctx, t->name, t->layer, t->grad, t->count, t->dtype, DEAR_MEM_HOST,
                                       update_cb, t),
                         DEAR_OK);
    }
}

/* Train ITERS iterations through the hooks; updates must run at the documented hook even across
 * plan switches (dear: in the next forward_begin; wfbp/sync: in backward_end). */
static void (*after_backward_end)(dear_ctx_t *ctx); /* test_verify's hand on the check */

static void train(dear_ctx_t *ctx, model_t *m, const char *sched)
{
    int deferred = strcmp(sched, "dear") == 0;
    for (int k = 0; k < ITERS; k++) {
        for (int l = 0; l < m->nlayers; l++) {
            ck_assert_int_eq(dear_forward_begin(ctx, m->layer_ids[l]), DEAR_OK);
            for (int i = m->lfirst[l]; i <= m->llast[l]; i++)
                ck_assert_int_eq(m->t[i].updates, k);
        }
        for (int l = m->nlayers - 1; l >= 0; l--) {
            for (int i = m->llast[l]; i >= m->lfirst[l]; i--)
                compute_grads(m, i, k, m->t[i].grad);
            ck_assert_int_eq(dear_backward_done(ctx, m->layer_ids[l]), DEAR_OK);
        }
        ck_assert_int_eq(dear_backward_end(ctx), DEAR_OK);
        if (after_backward_end)
            after_backward_end(ctx);
        for (int i = 0; i < NT; i++)
            ck_assert_int_eq(m->t[i].updates, deferred ? k : k + 1);
    }
    ck_assert_int_eq(dear_flush(ctx), DEAR_OK);
    for (int i = 0; i < NT; i++)
        ck_assert_int_eq(m->t[i].updates, ITERS);
}

static const model_t *reference(void)
{
    static model_t ref;
    static int ready;
    if (!ready) {
        model_init(&ref);
        reference_train(&ref, ITERS);
        ready = 1;
    }
    return &ref;
}

static void compare(const model_t *m, const char *what)
{
    const model_t *ref = reference();
    for (int i = 0; i < NT; i++)
        ck_assert_msg(memcmp(m->t[i].param, ref->t[i].param, m->t[i].count * esize(m->t[i].dtype)) == 0,
                      "%s: tensor %d differs from the MPI_Allreduce reference", what, i);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    for (size_t b = 0; b < n; b++)
        h = (h ^ ((const unsigned char *)p)[b]) * 1099511628211ULL;
    return h;
}

/* 1 if every rank holds the same value. */
static int same_everywhere(uint64_t h)
{
    uint64_t lo, hi;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

static uint64_t plan_hash(const dear_plan_t *p)
{
    uint64_t h = 1469598103934665603ULL;
    h = fnv(h, &p->rs.ngroups, sizeof p->rs.ngroups);
    h = fnv(h, p->rs.first, sizeof(int) * (size_t)(p->rs.ngroups + 1));
    h = fnv(h, &p->ag.ngroups, sizeof p->ag.ngroups);
    h = fnv(h, p->ag.first, sizeof(int) * (size_t)(p->ag.ngroups + 1));
    return fnv(h, p->planner, strlen(p->planner));
}

static void set_common(void)
{
    setenv("DEAR_FUSION_THRESHOLD", "1", 1); /* warm-up plan: one bucket per tensor */
    setenv("DEAR_WARMUP_ITERS", "2", 1);
    setenv("DEAR_REPLAN_EVERY", "3", 1);
}

static void unset_all(void)
{
    const char *vars[] = { "DEAR_SCHEDULE", "DEAR_FUSION", "DEAR_FUSION_THRESHOLD", "DEAR_WARMUP_ITERS",
                           "DEAR_REPLAN_EVERY", "DEAR_CALIBRATE", "DEAR_COST_PRESET", "DEAR_CALIBRATION_FILE",
                           "DEAR_LOG_LEVEL", "DEAR_VERIFY_ITERS" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

/* ---- plan switches: every planner x schedule ---- */

/* A committed context on a fresh model, with a preset cost model (no calibration). */
static dear_ctx_t *commit_preset(model_t *m, const char *sched, const char *planner, const char *preset)
{
    setenv("DEAR_SCHEDULE", sched, 1);
    setenv("DEAR_FUSION", planner, 1);
    setenv("DEAR_CALIBRATE", "off", 1);
    setenv("DEAR_COST_PRESET", preset, 1);
    model_init(m);
    dear_ctx_t *ctx = NULL;
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    register_model(ctx, m);
    ck_assert_int_eq(dear_commit(ctx), DEAR_OK);
    return ctx;
}

static const char *const planners[] = { "mgwfbp", "dp", "gradssa", "auto" };
static const char *const scheds[] = { "dear", "wfbp", "sync" };
static const char *const presets[] = { "10gbe", "ib56", "shm" };

START_TEST(test_switch)
{
    const char *planner = planners[_i % 4], *sched = scheds[_i / 4], *preset = presets[_i % 3];
    set_common();
    model_t m;
    dear_ctx_t *ctx = commit_preset(&m, sched, planner, preset);
    ck_assert_int_eq(ctx->calib_measured, 0);
    int sync = strcmp(sched, "sync") == 0;
    if (!sync) {
        char want[40];
        snprintf(want, sizeof want, "preset:%s", preset);
        ck_assert_str_eq(ctx->cost.source, want);
        ck_assert_str_eq(ctx->plan.planner, "threshold(warm-up)");
        ck_assert_int_ge(ctx->nbuckets, NT);
    }
    train(ctx, &m, sched);
    if (!sync) {
        /* planned after iterations 2, 5, 8 and 11 */
        ck_assert_int_eq(ctx->nplans, 4);
        ck_assert_msg(strstr(ctx->plan.planner, "warm-up") == NULL, "still on %s", ctx->plan.planner);
        /* start-up costs of 10-900 us against microseconds of compute: every planner fuses */
        ck_assert_msg(ctx->plan.rs.ngroups < NT, "%s/%s: %d buckets", planner, sched, ctx->plan.rs.ngroups);
    } else {
        ck_assert_int_eq(ctx->nplans, 0);
        ck_assert_int_eq(ctx->plan.rs.ngroups, 1);
    }
    ck_assert_msg(same_everywhere(plan_hash(&ctx->plan)), "ranks ended on different plans");
    ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
    char what[64];
    snprintf(what, sizeof what, "%s/%s/%s", planner, sched, preset);
    compare(&m, what);
    model_free(&m);
    unset_all();
}
END_TEST

/* ---- DEAR_VERIFY_ITERS: auto's plan is timed and dropped if the replaced one ran faster ---- */

static double fake_prev_s;

/* Right after the switch, every rank pretends the warm-up plan ran in fake_prev_s per iteration:
 * 1 ns makes any new plan the slower one, 1000 s the faster. */
static void fake_prev(dear_ctx_t *ctx)
{
    if (ctx->verify_at >= 0 && ctx->prev_iter_s != fake_prev_s) {
        ck_assert_int_eq(ctx->nplans, 1);
        ck_assert_msg(ctx->prev_iter_s > 0, "warm-up median %g", ctx->prev_iter_s);
        ck_assert_str_eq(ctx->prev_plan.planner, "threshold(warm-up)");
        ctx->prev_iter_s = fake_prev_s;
    }
}

START_TEST(test_verify)
{
    const char *sched = _i / 2 ? "wfbp" : "dear";
    int revert = _i % 2 == 0;
    set_common();
    setenv("DEAR_REPLAN_EVERY", "0", 1);
    setenv("DEAR_VERIFY_ITERS", "3", 1); /* planned after iteration 2, checked after 2 + 1 + 3 */
    model_t m;
    dear_ctx_t *ctx = commit_preset(&m, sched, "auto", "shm");
    ck_assert_int_eq(ctx->verify_iters, 3);
    fake_prev_s = revert ? 1e-9 : 1e3;
    after_backward_end = fake_prev;
    train(ctx, &m, sched);
    after_backward_end = NULL;
    ck_assert_int_eq(ctx->nplans, 1);
    ck_assert_int_eq(ctx->verify_at, -1);
    ck_assert_int_eq(ctx->nreverts, revert);
    if (revert) {
        ck_assert_str_eq(ctx->plan.planner, "threshold(warm-up)");
        ck_assert_int_ge(ctx->nbuckets, NT);
    } else {
        ck_assert_msg(strncmp(ctx->plan.planner, "auto", 4) == 0, "on %s", ctx->plan.planner);
        ck_assert_int_lt(ctx->plan.rs.ngroups, NT);
    }
    ck_assert_msg(same_everywhere(plan_hash(&ctx->plan)), "ranks ended on different plans");
    /* dear_plan_save writes the plan in use; it reads back equal. */
    char path[64];
    snprintf(path, sizeof path, "/tmp/dear-verify-%d-%d.plan", (int)getpid(), rank);
    ck_assert_int_eq(dear_plan_save(ctx, path), DEAR_OK);
    dear_plan_t back = { 0 };
    ck_assert_int_eq(dear_planfile_load(path, NT, NULL, NULL, &back), DEAR_OK);
    ck_assert(dear_plan_equal(&back, &ctx->plan));
    ck_assert_str_eq(back.planner, ctx->plan.planner);
    dear_plan_free(&back);
    unlink(path);
    ck_assert_int_eq(dear_plan_save(ctx, ""), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
    char what[64];
    snprintf(what, sizeof what, "verify %s %s", sched, revert ? "revert" : "keep");
    compare(&m, what);
    model_free(&m);
    unset_all();
}
END_TEST

/* ---- calibration and its cache ---- */

static char cache[256];

static dear_ctx_t *commit_logged(model_t *m)
{
    dear_ctx_t *ctx = NULL;
    capture_start();
    ck_assert_int_eq(dear_init(MPI_COMM_WORLD, &ctx), DEAR_OK);
    register_model(ctx, m);
    int rc = dear_commit(ctx);
    capture_stop();
    ck_assert_int_eq(rc, DEAR_OK);
    return ctx;
}

static uint64_t cost_hash(const dear_ctx_t *ctx)
{
    return fnv(1469598103934665603ULL, &ctx->cost.line, sizeof ctx->cost.line);
}

START_TEST(test_calibration)
{
    long long id = (long long)getpid();
    MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    snprintf(cache, sizeof cache, "/tmp/dear-online-%lld-np%d.cost", id, nranks);
    char corrupt[300];
    snprintf(corrupt, sizeof corrupt, "%s.corrupt", cache);
    if (rank == 0) {
        unlink(cache);
        unlink(corrupt);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    set_common();
    setenv("DEAR_FUSION", "dp", 1);
    setenv("DEAR_CALIBRATE", "auto", 1);
    setenv("DEAR_CALIBRATION_FILE", cache, 1);
    setenv("DEAR_LOG_LEVEL", "info", 1);
    model_t m;

    /* 1: no cache: measured, fitted, written */
    model_init(&m);
    double t0 = MPI_Wtime();
    dear_ctx_t *ctx = commit_logged(&m);
    double took = MPI_Wtime() - t0;
    ck_assert_int_eq(ctx->calib_measured, 1);
    ck_assert_str_eq(ctx->cost.source, "fit");
    ck_assert_msg(strstr(logbuf, "calibration: measured") != NULL, "log: %s", logbuf);
    /* 1 s at np 4 on 2 idle cores (three passes); 10.3 s under make -j2 check, where another
     * 4-rank test shares the cores: the bound only catches a runaway calibration */
    ck_assert_msg(took < 30, "calibration took %.1f s", took);
    for (int op = 0; op < DEAR_COST_NOPS; op++) {
        int any = 0;
        for (int a = 0; a < DEAR_COST_NALGOS; a++)
            if (ctx->cost.line[op][a].valid) {
                any = 1;
                ck_assert(ctx->cost.line[op][a].beta > 0 || ctx->cost.line[op][a].alpha > 0);
                ck_assert_int_ge(ctx->cost.line[op][a].nsamples, 2);
            }
        ck_assert_msg(any, "no fitted line for %s", dear_cost_op_name((dear_cost_op_t)op));
        /* what the selection table runs, measured at every calibration size: a curve */
        const dear_cost_line_t *c = &ctx->cost.line[op][DEAR_COST_AUTO];
        ck_assert_msg(c->valid && c->npts == 7, "%s: auto curve valid %d with %d points",
                      dear_cost_op_name((dear_cost_op_t)op), c->valid, c->npts);
        for (int i = 1; i < c->npts; i++)
            ck_assert(c->pt_bytes[i] > c->pt_bytes[i - 1] && c->pt_sec[i] >= c->pt_sec[i - 1]);
        ck_assert(c->pt_sec[0] > 0);
    }
    ck_assert_msg(same_everywhere(cost_hash(ctx)), "ranks hold different cost models");
    dear_cost_model_t fitted = ctx->cost;
    if (rank == 0)
        ck_assert_int_eq(access(cache, R_OK), 0);
    ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
    model_free(&m);

    /* 2: the cache is used (nothing measured, same model), and training with it is exact */
    model_init(&m);
    ctx = commit_logged(&m);
    ck_assert_int_eq(ctx->calib_measured, 0);
    ck_assert_msg(rank != 0 || strstr(logbuf, "loaded from the calibration cache") != NULL, "log: %s", logbuf);
    ck_assert_msg(strstr(logbuf, "calibration: measured") == NULL, "measured again: %s", logbuf);
    ck_assert_msg(same_everywhere(cost_hash(ctx)), "ranks hold different cost models");
    /* the cache keeps 9 significant digits */
    for (int op = 0; op < DEAR_COST_NOPS; op++)
        for (int a = 0; a < DEAR_COST_NALGOS; a++) {
            const dear_cost_line_t *x = &fitted.line[op][a], *y = &ctx->cost.line[op][a];
            ck_assert_int_eq(x->valid, y->valid);
            ck_assert(fabs(x->alpha - y->alpha) <= 1e-8 * x->alpha && fabs(x->beta - y->beta) <= 1e-8 * x->beta);
            ck_assert_int_eq(x->npts, y->npts);
            for (int i = 0; i < x->npts; i++)
                ck_assert(fabs(x->pt_sec[i] - y->pt_sec[i]) <= 1e-8 * x->pt_sec[i]);
        }
    train(ctx, &m, "dear");
    ck_assert_int_eq(ctx->nplans, 4);
    ck_assert_msg(same_everywhere(plan_hash(&ctx->plan)), "ranks ended on different plans");
    ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
    compare(&m, "dp/dear/calibrated");
    model_free(&m);

    /* 3: a corrupt cache: error naming the line, a warning, measured again, file replaced */
    if (rank == 0) {
        FILE *f = fopen(cache, "w");
        ck_assert_ptr_nonnull(f);
        fputs("dear-cost 1\n2 2 rs ring not-a-number\n", f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    model_init(&m);
    ctx = commit_logged(&m);
    ck_assert_int_eq(ctx->calib_measured, 1);
    if (rank == 0) {
        ck_assert_msg(strstr(logbuf, "is corrupt") != NULL && strstr(logbuf, ":2:") != NULL, "log: %s", logbuf);
        ck_assert_int_eq(access(corrupt, R_OK), 0);
        dear_cost_model_t back;
        int found = 0;
        ck_assert_int_eq(dear_cost_load(cache, nranks, ctx->cost.ranks_per_host, &back, &found), DEAR_OK);
        ck_assert_int_gt(found, 0);
        for (int op = 0; op < DEAR_COST_NOPS; op++)
            for (int a = 0; a < DEAR_COST_NALGOS; a++)
                ck_assert_int_eq(back.line[op][a].valid, ctx->cost.line[op][a].valid);
        unlink(cache);
        unlink(corrupt);
    }
    ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
    model_free(&m);
    unset_all();
}
END_TEST

/* ---- DEAR_CALIBRATE=off with each preset; DEAR_PLAN_FILE and threshold stay fixed ---- */

START_TEST(test_presets)
{
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
        setenv("DEAR_FUSION", "auto", 1);
        setenv("DEAR_CALIBRATE", "off", 1);
        setenv("DEAR_COST_PRESET", presets[p], 1);
        model_t m;
        model_init(&m);
        dear_ctx_t *ctx = commit_logged(&m);
        char want[40];
        snprintf(want, sizeof want, "preset:%s", presets[p]);
        ck_assert_str_eq(ctx->cost.source, want);
        ck_assert_int_eq(ctx->cost.comm_size, nranks);
        ck_assert_int_eq(ctx->calib_measured, 0);
        ck_assert(ctx->cost.line[DEAR_COST_AR][DEAR_COST_RING].valid);
        ck_assert(ctx->cost.line[DEAR_COST_AR][DEAR_COST_RING].alpha > 0);
        ck_assert_int_eq(ctx->online, 1);
        ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
        model_free(&m);
    }
    /* threshold never re-plans */
    setenv("DEAR_FUSION", "threshold", 1);
    model_t m;
    model_init(&m);
    dear_ctx_t *ctx = commit_logged(&m);
    ck_assert_int_eq(ctx->online, 0);
    ck_assert_int_eq(ctx->next_plan_iter, -1);
    ck_assert_int_eq(dear_finalize(ctx), DEAR_OK);
    model_free(&m);
    unset_all();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("online");
    TCase *tc = tcase_create("online");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_switch, 0, 12);
    tcase_add_loop_test(tc, test_verify, 0, 4);
    tcase_add_test(tc, test_calibration);
    tcase_add_test(tc, test_presets);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    int provided = 0, failed = 0;
    (void)argc;
    (void)argv;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "MPI lacks MPI_THREAD_MULTIPLE: skipped\n");
        MPI_Finalize();
        return 77;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks < 2) {
        MPI_Finalize();
        return 77; /* one rank never plans online: nothing to communicate */
    }
    SRunner *sr = srunner_create(suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}

/*
 * dear-bench: the profile-driven benchmark driver. It loads a model profile (docs/FORMATS.md),
 * emulates the model it describes (model.c) and runs each configuration (schedule, planner,
 * threshold) of the command line (args.c) through the runtime's public API, from fresh
 * parameters, checking the parameters after every run. For each configuration it prints the
 * median iteration time, exposed communication, blocked time, speedups over sync and over
 * wfbp+threshold 64 MiB, the simulator's prediction under a cost model and the lower bound
 * (predict.c), and optionally writes them as CSV. Profile and prediction come from the fusion
 * library's pure functions; everything the runtime does goes through include/dear.h.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "base/fileio.h"
#include "base/stats.h"
#include "base/util.h"
#include "fusion/cost.h"
#include "fusion/plan.h"
#include "fusion/planfile.h"
#include "fusion/profile.h"
#include "include/dear.h"
#include "apps/bench/args.h"
#include "apps/bench/bench.h"
#include "apps/bench/model.h"
#include "apps/bench/predict.h"

#define REF64M ((size_t)64 << 20)
#define CLOCK_TAG 7301 /* clock_offsets' messages on MPI_COMM_WORLD, which libdear never uses as is */

typedef struct {
    int ok_run;                 /* the runtime accepted and ran the configuration */
    int check_ok;
    double iter_s, iter_min_s, iter_max_s, compute_s, blocked_s, pred_s;
    double period_s;            /* median over iterations of the ranks' mean iteration: the period */
    double iter_q1_s, iter_q3_s;  /* quartiles of the measured iterations: the run-to-run noise */
    double upd_s;               /* update callback time per iteration (slowest rank, mean of rounds) */
    double upd_typ_s;           /* what the prediction counts: each layer's median rank's (sharded: slowest) */
    double late_s;              /* the last rank's lateness at the end of backward (median over iterations) */
    char status[96];
    /* rank 0: the plan each round ran (dear_plan_save; empty if unknown), so each round's time is
     * predicted from its own plan: a planner fed noisy measurements may plan differently per run */
    dear_plan_t *plans;
    double *scales;             /* rank 0: each round's factor on the collectives' prices that the
                                 * runtime fitted to training (dear_get_plan_info; 1: none) */
    double *round_s;            /* each round's period (median of the ranks' mean iteration) */
    /* accumulated over the rounds, then summarised by result_finish */
    double *samples, *comp;     /* slowest rank's measured iterations and their compute */
    double *means;              /* the ranks' mean of each measured iteration */
    double *late;               /* per measured iteration, the last rank's lateness at the end of backward */
    int nsamples;
    double blocked_sum;         /* per-iteration blocked time, summed over rounds */
    double *upd_sum;            /* per layer index: update callback time per iteration, the slowest
                                 * rank's, summed over rounds */
    double *upd_typ;            /* the same, the median rank's (the prediction's: the last rank's lateness
                                 * adds the rest; the sum over layers of each layer's slowest rank stands
                                 * above any one rank's) */
    int nrounds;
    /* time to train, per round (slowest rank): dear_init to the end of commit, to the end of
     * iteration --first-n (NAN when the run is shorter) and of the whole run */
    double *startup, *first_n, *whole;
    int run_iters;              /* iterations of one run (the last round's) */
    double startup_s, first_n_s, whole_s; /* their medians over the rounds */
} result_t;

/* Everything one invocation holds, step by step through main. */
typedef struct {
    bench_opts_t o;
    bench_model_t m;
    result_t res[MAX_CONFIGS];
    char *calib;                /* rank 0: the runtime's calibration cache, NULL when not used */
    int calib_created, use_rt_calib;
    dear_cost_model_t model;    /* of the predictions */
    dear_cost_model_t fitted;   /* the same made dearer by one round's fit (result_t.scales) */
    bench_links_t links;        /* of the lower bounds */
    double bound;               /* the lower bound of the bytes of the dense float32 gradient */
    double bounds[MAX_CONFIGS]; /* each configuration's, of the bytes its gradient puts on the wire */
    int failed_check, broken, refused;
} bench_t;

int bench_rank, bench_size;

void bench_say(const char *fmt, ...)
{
    if (bench_rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* ---- one configuration ---- */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Quantile q of v[0..n) by linear interpolation between order statistics; sorts v. */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    double x = q * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

static double median(double *v, int n)
{
    return quantile(v, n, 0.5);
}

/* name=value, or the value it had when dear-bench started (saved at the first call; unset if
 * none), so one configuration's setting does not leak into the next. */
static int set_or_restore(const char *name, const char *value)
{
    static struct {
        const char *name;
        char *orig;
        int saved;
    } keep[] = { { "DEAR_FIRST_PLAN", NULL, 0 }, { "DEAR_WARMUP_ITERS", NULL, 0 } };
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        if (strcmp(keep[i].name, name) != 0)
            continue;
        if (!keep[i].saved) {
            const char *v = getenv(name);
            keep[i].orig = v ? strdup(v) : NULL;
            keep[i].saved = 1;
        }
        if (value)
            return setenv(name, value, 1);
        return keep[i].orig ? setenv(name, keep[i].orig, 1) : unsetenv(name);
    }
    return -1;
}

static int set_env(const bench_config_t *c, const bench_opts_t *o)
{
    char thr[32], part[32];
    if (setenv("DEAR_COMPRESS", dear_compress_name((dear_compress_t)c->comp_rs), 1) ||
        setenv("DEAR_COMPRESS_AG", dear_compress_name((dear_compress_t)c->comp_ag), 1) ||
        setenv("DEAR_COMPRESS_EF", c->ef ? "1" : "0", 1))
        return DEAR_ERR_NOMEM;
    snprintf(thr, sizeof thr, "%zu", bench_scaled_threshold(c, o));
    snprintf(part, sizeof part, "%zu", bench_scaled_partition(c, o));
    if (setenv("DEAR_SCHEDULE", c->sched, 1) || setenv("DEAR_FUSION_THRESHOLD", thr, 1) ||
        setenv("DEAR_FUSION", strcmp(c->fusion, "one") ? c->fusion : "threshold", 1) ||
        setenv("DEAR_SPARSE", c->sparse ? "auto" : "off", 1) || setenv("DEAR_PARTITION", part, 1) ||
        setenv("DEAR_SHARD", c->shard ? "1" : "0", 1) ||
        set_or_restore("DEAR_FIRST_PLAN", c->first[0] ? c->first : NULL) ||
        set_or_restore("DEAR_WARMUP_ITERS", c->hold ? "1000000" : NULL))
        return DEAR_ERR_NOMEM;
    return DEAR_OK;
}

/* Rank 0: what the runtime ran, read back through a plan file, so the prediction simulates
 * that plan (auto may have kept the warm-up plan after timing its own). Best effort: without
 * it the prediction plans the configuration itself. */
static int keep_plan(dear_ctx_t *ctx, const bench_model_t *m, result_t *res)
{
    dear_plan_t *np = realloc(res->plans, sizeof *np * (size_t)(res->nrounds + 1));
    if (!np)
        return DEAR_ERR_NOMEM;
    res->plans = np;
    double *ns = realloc(res->scales, sizeof *ns * (size_t)(res->nrounds + 1));
    if (!ns)
        return DEAR_ERR_NOMEM;
    res->scales = ns;
    dear_plan_info_t info = { .size = sizeof info };
    ns[res->nrounds] = dear_get_plan_info(ctx, &info) == DEAR_OK ? info.comm_scale : 1;
    dear_plan_t *pl = &np[res->nrounds];
    memset(pl, 0, sizeof *pl);
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/dear-bench-plan-XXXXXX", dir && dir[0] ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return DEAR_OK;
    close(fd);
    if (dear_plan_save(ctx, path) != DEAR_OK || dear_planfile_load(path, m->prof.ntensors, NULL, NULL, pl) != DEAR_OK)
        dear_plan_free(pl);
    unlink(path);
    return DEAR_OK;
}

/* The plan of res's last round (an empty one when none was kept). */
static const dear_plan_t *last_plan(const result_t *res)
{
    static const dear_plan_t none = { 0 };
    return res->plans && res->nrounds > 0 ? &res->plans[res->nrounds - 1] : &none;
}

/* A plan in a few characters: planner, buckets/groups/early, and whether tensors were cut. */
static void plan_brief(const dear_plan_t *pl, char *buf, size_t len)
{
    if (pl->ntensors > 0)
        snprintf(buf, len, "%s %d/%d/%d%s", pl->planner, pl->rs.ngroups, pl->ag.ngroups, pl->ag_early,
                 pl->nunits > pl->ntensors ? " cut" : "");
    else
        snprintf(buf, len, "-");
}

/* Per-iteration wall and compute times of one run, this rank's, then the slowest rank's; when
 * this rank's backward passes ended (arr_s), then every rank's (arr_all, rank by rank). */
typedef struct {
    double *it_s, *comp_s, *arr_s, *it_max, *it_sum, *comp_max, *arr_all;
} times_t;

static int times_alloc(times_t *t, int total)
{
    double **v[6] = { &t->it_s, &t->comp_s, &t->arr_s, &t->it_max, &t->it_sum, &t->comp_max };
    int ok = 1;
    for (int k = 0; k < 6; k++)
        ok &= (*v[k] = calloc((size_t)total, sizeof(double))) != NULL;
    ok &= (t->arr_all = calloc((size_t)total * (size_t)bench_size, sizeof(double))) != NULL;
    return ok ? DEAR_OK : DEAR_ERR_NOMEM;
}

static void times_free(times_t *t)
{
    free(t->it_s), free(t->comp_s), free(t->arr_s), free(t->it_max), free(t->it_sum), free(t->comp_max);
    free(t->arr_all);
}

/* Each rank's MPI_Wtime minus rank 0's (NULL until clock_offsets): the ranks' arrival times are
 * compared across hosts, whose clocks need not agree. */
static double *clock_off;

/* Estimate clock_off on every rank: rank 0 exchanges eight timestamps with each other rank and
 * keeps the exchange of least round trip, taking the other clock's reading to fall at its
 * midpoint (zeros where MPI says its clock is global). Collective. */
static int clock_offsets(void)
{
    int *global = NULL, found = 0, ok, all;
    clock_off = calloc((size_t)bench_size, sizeof(double));
    ok = clock_off != NULL;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all)
        return DEAR_ERR_NOMEM;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_WTIME_IS_GLOBAL, &global, &found);
    if (found && global && *global)
        return DEAR_OK;
    for (int r = 1; r < bench_size; r++) {
        double best = INFINITY, t0, t1, tr;
        for (int k = 0; k < 8; k++) {
            if (bench_rank == 0) {
                t0 = MPI_Wtime();
                MPI_Send(&t0, 1, MPI_DOUBLE, r, CLOCK_TAG, MPI_COMM_WORLD);
                MPI_Recv(&tr, 1, MPI_DOUBLE, r, CLOCK_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                t1 = MPI_Wtime();
                if (t1 - t0 < best) {
                    best = t1 - t0;
                    clock_off[r] = tr - (t0 + t1) / 2;
                }
            } else if (bench_rank == r) {
                MPI_Recv(&t0, 1, MPI_DOUBLE, 0, CLOCK_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                tr = MPI_Wtime();
                MPI_Send(&tr, 1, MPI_DOUBLE, 0, CLOCK_TAG, MPI_COMM_WORLD);
            }
        }
    }
    MPI_Bcast(clock_off, bench_size, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return DEAR_OK;
}

/* Warm-up and measured iterations, total in all; the runtime's statistics when the measured
 * ones start (st0) and after them (st1). */
static int measure(dear_ctx_t *ctx, const bench_opts_t *o, bench_model_t *m, int warmup, int total, times_t *t,
                   dear_stats_t *st0, dear_stats_t *st1)
{
    int rc = DEAR_OK;
    for (long it = 0; it < total && rc == DEAR_OK; it++) {
        if (it == warmup) {
            rc = dear_get_stats(ctx, st0);
            bench_model_upd_zero(m);
        }
        int fault = o->fault == 1 && bench_rank == bench_size - 1 && it == total / 2;
        double t0 = MPI_Wtime();
        if (rc == DEAR_OK)
            rc = bench_model_iterate(ctx, m, it, fault, &t->comp_s[it], &t->arr_s[it]);
        t->it_s[it] = MPI_Wtime() - t0;
    }
    if (rc == DEAR_OK)
        rc = dear_get_stats(ctx, st1);
    return rc;
}

/* Entry i of every rank's row of all (bench_size rows of n, as MPI_Allgather leaves them), less
 * off[rank] when off is not NULL, into col; returns their median and sets *most to their largest. */
static double ranks_median(const double *all, int n, int i, const double *off, double *col, double *most)
{
    *most = -INFINITY;
    for (int r = 0; r < bench_size; r++) {
        col[r] = all[(size_t)r * (size_t)n + (size_t)i] - (off ? off[r] : 0);
        *most = fmax(*most, col[r]);
    }
    return dear_median(col, (size_t)bench_size);
}

/* How much later than the median rank the last rank ended the backward pass of iteration it
 * (every collective of the pass's end waits for it; the profile is one rank's), on rank 0's clock;
 * col: bench_size doubles of scratch. */
static double lateness(const times_t *t, int total, int it, double *col)
{
    double most, med = ranks_median(t->arr_all, total, it, clock_off, col, &most);
    return most - med;
}

/* Add a round's measured iterations to res: an iteration lasts as long as its slowest rank,
 * and so does the blocked time (blocked: this rank's, per iteration). Collective. */
static int pool_round(result_t *res, times_t *t, int warmup, int iters, double blocked)
{
    int total = warmup + iters;
    MPI_Allreduce(t->it_s, t->it_max, total, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(t->it_s, t->it_sum, total, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(t->comp_s, t->comp_max, total, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allgather(t->arr_s, total, MPI_DOUBLE, t->arr_all, total, MPI_DOUBLE, MPI_COMM_WORLD);
    double *col = malloc(sizeof(double) * (size_t)bench_size);
    double blocked_max;
    MPI_Allreduce(&blocked, &blocked_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double *ns = realloc(res->samples, sizeof(double) * (size_t)(res->nsamples + iters));
    double *nc = ns ? realloc(res->comp, sizeof(double) * (size_t)(res->nsamples + iters)) : NULL;
    double *na = nc ? realloc(res->late, sizeof(double) * (size_t)(res->nsamples + iters)) : NULL;
    double *nm = na ? realloc(res->means, sizeof(double) * (size_t)(res->nsamples + iters)) : NULL;
    double *nr = nm ? realloc(res->round_s, sizeof(double) * (size_t)(res->nrounds + 1)) : NULL;
    if (ns)
        res->samples = ns;
    if (nc)
        res->comp = nc;
    if (na)
        res->late = na;
    if (nm)
        res->means = nm;
    if (nr)
        res->round_s = nr;
    if (!ns || !nc || !na || !nm || !nr || !col) {
        free(col);
        return DEAR_ERR_NOMEM;
    }
    memcpy(res->samples + res->nsamples, t->it_max + warmup, sizeof(double) * (size_t)iters);
    memcpy(res->comp + res->nsamples, t->comp_max + warmup, sizeof(double) * (size_t)iters);
    for (int i = 0; i < iters; i++) {
        res->late[res->nsamples + i] = lateness(t, total, warmup + i, col);
        res->means[res->nsamples + i] = t->it_sum[warmup + i] / bench_size;
    }
    free(col);
    nr[res->nrounds] = dear_median(res->means + res->nsamples, (size_t)iters);
    res->nsamples += iters;
    res->blocked_sum += blocked_max;
    res->nrounds++;
    return DEAR_OK;
}

/* Add a round's update callback time per layer and iteration to res, the slowest rank's and the
 * median rank's. The runtime calls the updates in its hooks, on the application's thread, so the
 * predictions count them as compute. Collective. */
static int pool_updates(result_t *res, const bench_model_t *m, int iters)
{
    int nl = m->prof.nlayers;
    double *mine = malloc(sizeof(double) * (size_t)nl), *col = malloc(sizeof(double) * (size_t)bench_size);
    double *all = malloc(sizeof(double) * (size_t)nl * (size_t)bench_size);
    if (!res->upd_sum)
        res->upd_sum = calloc((size_t)nl, sizeof(double));
    if (!res->upd_typ)
        res->upd_typ = calloc((size_t)nl, sizeof(double));
    int rc = mine && all && col && res->upd_sum && res->upd_typ ? DEAR_OK : DEAR_ERR_NOMEM, any;
    MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD); /* DEAR_OK is 0, errors below */
    if (any == DEAR_OK) {
        bench_model_upd_per_layer(m, iters, mine);
        MPI_Allgather(mine, nl, MPI_DOUBLE, all, nl, MPI_DOUBLE, MPI_COMM_WORLD);
        for (int l = 0; l < nl; l++) {
            double most;
            res->upd_typ[l] += ranks_median(all, nl, l, NULL, col, &most);
            res->upd_sum[l] += most;
        }
    }
    free(mine);
    free(all);
    free(col);
    return any == DEAR_OK ? DEAR_OK : DEAR_ERR_NOMEM;
}

/* Time to train, this round's: from dear_init to the end of iteration first_n and of the run,
 * each rank's own sum, the slowest rank's kept. Collective. */
static int time_to_train(result_t *res, const times_t *t, double startup, int total, int first_n)
{
    double mine[3] = { startup, startup, startup }, most[3];
    for (int i = 0; i < total; i++) {
        if (i < first_n)
            mine[1] += t->it_s[i];
        mine[2] += t->it_s[i];
    }
    MPI_Allreduce(mine, most, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int r = res->nrounds - 1; /* pool_round counted this round */
    double **v[3] = { &res->startup, &res->first_n, &res->whole };
    for (int k = 0; k < 3; k++) {
        double *p = realloc(*v[k], sizeof(double) * (size_t)(r + 1));
        if (!p)
            return DEAR_ERR_NOMEM;
        *v[k] = p;
        p[r] = k == 1 && total < first_n ? NAN : most[k];
    }
    res->run_iters = total;
    return DEAR_OK;
}

typedef struct {
    const bench_model_t *m;
    atomic_int stop;
    long iters;
} replay_t;

static void *replay_main(void *arg)
{
    replay_t *r = arg;
    r->iters = bench_model_replay(r->m, &r->stop);
    return NULL;
}

/* dear_commit, with the model's compute replayed beside it under --calib-load. */
static int commit(dear_ctx_t *ctx, const bench_opts_t *o, const bench_model_t *m)
{
    replay_t r = { .m = m };
    pthread_t th;
    int load = o->calib_load && pthread_create(&th, NULL, replay_main, &r) == 0;
    if (o->calib_load && !load)
        fprintf(stderr, "dear-bench: rank %d: --calib-load: cannot start the replay thread; committing without\n",
                bench_rank);
    double t0 = MPI_Wtime();
    int rc = dear_commit(ctx);
    if (load) {
        atomic_store(&r.stop, 1);
        pthread_join(th, NULL);
        if (bench_rank == 0 && !o->quiet)
            printf("--calib-load: dear_commit took %.3f s beside %ld replayed iteration(s) of the model\n",
                   MPI_Wtime() - t0, r.iters);
    }
    return rc;
}

/* Run one configuration from fresh parameters: init, register, commit, warm-up + measured
 * iterations (iters), flush, finalize, then the parameter check; the measured iterations are
 * added to res (zeroed by the caller before the first round). Collective. */
static int run_config(const bench_config_t *c, const bench_opts_t *o, int iters, bench_model_t *m, result_t *res)
{
    int warmup = c->warmup, total = warmup + iters;
    bench_model_reset(m);
    if (set_env(c, o) != DEAR_OK)
        return DEAR_ERR_NOMEM;

    dear_ctx_t *ctx = NULL;
    double t_init = MPI_Wtime();
    int rc = dear_init(MPI_COMM_WORLD, &ctx);
    if (rc == DEAR_OK)
        rc = bench_model_register(ctx, m, !c->nohints);
    if (rc == DEAR_OK)
        rc = commit(ctx, o, m);
    double startup = MPI_Wtime() - t_init;
    if (rc != DEAR_OK) {
        /* Refusals (a planner not built, a bad DEAR_* value) are collective: every rank is here. */
        snprintf(res->status, sizeof res->status, "refused: %s", dear_status_string(rc));
        res->ok_run = 0;
        dear_finalize(&ctx);
        return DEAR_OK;
    }
    times_t tm;
    dear_stats_t st0 = { 0 }, st1 = { 0 };
    rc = times_alloc(&tm, total);
    if (rc == DEAR_OK)
        rc = measure(ctx, o, m, warmup, total, &tm, &st0, &st1);
    if (rc == DEAR_OK)
        rc = dear_flush(ctx);
    if (rc == DEAR_OK && bench_rank == 0)
        rc = keep_plan(ctx, m, res);
    int frc = dear_finalize(&ctx);
    if (rc == DEAR_OK)
        rc = frc;
    /* A failure on one rank must not leave the others waiting in the next collective. */
    int local = rc != DEAR_OK, any;
    MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        snprintf(res->status, sizeof res->status, "run failed%s%s", local ? ": " : " on another rank",
                 local ? dear_status_string(rc) : "");
        times_free(&tm);
        return rc != DEAR_OK ? rc : DEAR_ERR_INTERNAL;
    }
    if (o->fault == 2 && bench_rank == bench_size - 1)
        m->param[m->nelem / 2] += 1e-3f;
    rc = pool_round(res, &tm, warmup, iters, (st1.blocked_s - st0.blocked_s) / iters);
    if (rc == DEAR_OK)
        rc = pool_updates(res, m, iters);
    if (rc == DEAR_OK)
        rc = time_to_train(res, &tm, startup, total, o->first_n);
    times_free(&tm);
    if (rc != DEAR_OK)
        return rc;
    char why[96];
    int ok = bench_check_params(m, total, c->shard, (dear_compress_t)c->comp_ag, why, sizeof why);
    if (res->nrounds == 1 || (res->check_ok && !ok)) {
        res->check_ok = ok;
        snprintf(res->status, sizeof res->status, "%s", ok ? "ok" : why);
    }
    res->ok_run = 1;
    return DEAR_OK;
}

/* The pooled measured iterations of every round: medians, quartiles, extremes. */
static void result_finish(result_t *res)
{
    if (!res->ok_run || res->nsamples == 0)
        return;
    double *v = res->samples; /* sorted in place by the quantiles */
    int n = res->nsamples;
    res->iter_min_s = res->iter_max_s = v[0];
    for (int i = 1; i < n; i++) {
        res->iter_min_s = fmin(res->iter_min_s, v[i]);
        res->iter_max_s = fmax(res->iter_max_s, v[i]);
    }
    res->iter_s = median(v, n);
    res->period_s = dear_median(res->means, (size_t)n);
    res->iter_q1_s = quantile(v, n, 0.25);
    res->iter_q3_s = quantile(v, n, 0.75);
    res->compute_s = median(res->comp, n);
    res->blocked_s = res->blocked_sum / res->nrounds;
    res->startup_s = median(res->startup, res->nrounds);
    res->first_n_s = median(res->first_n, res->nrounds);
    res->whole_s = median(res->whole, res->nrounds);
}

/* ---- the steps of main ---- */

/* A rank that dies mid-run would leave the others waiting for its data forever: unless the
 * user chose otherwise, the runtime aborts the job after two minutes without progress. */
static void default_stall_abort(void)
{
    if (!getenv("DEAR_STALL_ABORT_S"))
        setenv("DEAR_STALL_ABORT_S", "120", 0);
}

/* The profile, scaled into m. 0, or the exit status: 2 for a bad profile, 1 when a rank could
 * not build the model (all ranks agree). */
static int load_scaled_model(const bench_opts_t *o, bench_model_t *m)
{
    dear_profile_t src = { 0 };
    if (dear_prof_load(o->profile, &src) != DEAR_OK) {
        if (bench_rank == 0)
            fprintf(stderr, "dear-bench: cannot use profile %s (see the error above)\n", o->profile);
        return 2;
    }
    int rc = bench_model_build(&src, o, m), any, local;
    dear_prof_free(&src);
    local = rc != DEAR_OK;
    MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        bench_model_free(m);
        return rc == DEAR_ERR_FORMAT ? 2 : 1;
    }
    for (int i = 0; i < o->nconfigs; i++)
        if (o->configs[i].sparse && m->nsparse == 0) {
            if (bench_rank == 0)
                fprintf(stderr, "dear-bench: configuration '%s': profile %s declares no sparse tensor (a 'sparse' "
                                "record, docs/FORMATS.md)\n", o->configs[i].text, o->profile);
            bench_model_free(m);
            return 2;
        }
    return 0;
}

static void say_intro(const bench_t *b)
{
    const bench_opts_t *o = &b->o;
    const dear_profile_t *p = &b->m.prof;
    if (!o->quiet)
        bench_say("dear-bench: %s, %d ranks; %d layers, %d tensors, %.2f MiB of float32 gradients (size x %g); "
            "forward %.3f ms + backward %.3f ms (time x %g); %d measured iterations per configuration in %d "
            "round(s), after %s warm-up iterations per run\n\n",
            p->model, bench_size, p->nlayers, p->ntensors, dear_prof_bytes_total(p) / 1048576.0, o->size_scale,
            dear_prof_fwd_total(p) * 1e3, dear_prof_bwd_total(p) * 1e3, o->time_scale, o->iters, o->rounds,
            o->warmup >= 0 ? "--warmup" : "its planner's");
    for (int t = 0; !o->quiet && t < p->ntensors; t++) {
        const sparse_t *sp = &b->m.sp[t];
        if (sp->rows)
            bench_say("sparse %s: %zu rows of %zu; %ld Zipf(%g) draws per rank and iteration: expected %.2f%% of the "
                "rows on one rank, %.2f%% on any (configurations '+sparse' send them sparse)\n",
                p->tensors[t].name, sp->rows, sp->row_elems, sp->tokens, o->zipf, 100 * sp->dens_rs,
                100 * sp->dens_ag);
    }
    if (!o->quiet && b->m.nsparse)
        bench_say("\n");
    if (!o->quiet && o->jitter_ms > 0)
        bench_say("injected jitter: up to %g ms per iteration and rank, uniform, seed %d\n\n", o->jitter_ms,
            o->jitter_seed);
}

static void open_runtime_calibration(bench_t *b)
{
    b->calib = bench_runtime_calibration_file(&b->o, &b->calib_created);
    b->use_rt_calib = b->calib != NULL;
    MPI_Bcast(&b->use_rt_calib, 1, MPI_INT, 0, MPI_COMM_WORLD);
}

/* Every round runs every configuration the runtime accepted, a share of --iters each. A run that
 * breaks ends all runs and is the last configuration reported. */
static void run_configs(bench_t *b)
{
    bench_opts_t *o = &b->o;
    for (int round = 0; round < o->rounds && !b->broken; round++) {
        int iters = o->iters / o->rounds + (round < o->iters % o->rounds);
        for (int i = 0; i < o->nconfigs; i++) {
            if (round > 0 && !b->res[i].ok_run)
                continue; /* refused: the same again */
            if (!o->quiet)
                bench_say("running %s (round %d of %d) ...\n", o->configs[i].text, round + 1, o->rounds);
            if (run_config(&o->configs[i], o, iters, &b->m, &b->res[i]) != DEAR_OK) {
                b->broken = 1;
                if (bench_rank == 0)
                    fprintf(stderr, "dear-bench: configuration %s: %s\n", o->configs[i].text, b->res[i].status);
                o->nconfigs = i + 1;
                break; /* the runtime's state after a failed run is unknown: stop here */
            }
        }
    }
}

/* Summarise every configuration's rounds and say which were refused or failed the check. */
static void check_results(bench_t *b)
{
    for (int i = 0; i < b->o.nconfigs; i++) {
        result_t *r = &b->res[i];
        result_finish(r);
        r->pred_s = NAN;
        if (b->broken && i == b->o.nconfigs - 1)
            continue;
        if (!r->ok_run) {
            b->refused = 1;
            if (bench_rank == 0)
                fprintf(stderr, "dear-bench: configuration %s: %s\n", b->o.configs[i].text, r->status);
        } else if (!r->check_ok) {
            b->failed_check = 1;
            if (bench_rank == 0)
                fprintf(stderr, "dear-bench: configuration %s: PARAMETER CHECK FAILED (%s)\n", b->o.configs[i].text,
                        r->status);
        }
    }
}

/* The cost model of the predictions, with the model the runtime planned with when it
 * calibrated during the runs; the temporary calibration cache is removed. */
static int load_prediction_model(bench_t *b)
{
    int rc = bench_load_model(&b->o, b->use_rt_calib, b->calib, dear_prof_bytes_total(&b->m.prof), &b->model);
    if (b->calib_created)
        unlink(b->calib);
    if (rc != DEAR_OK && bench_rank == 0)
        fprintf(stderr, "dear-bench: no cost model for predictions: %s\n", dear_status_string(rc));
    return rc;
}

/* Configuration i's update time per iteration, the slowest rank's per layer (typical: the
 * median rank's): per layer index into upd_s (NULL: only the sum), averaged over its rounds;
 * the sum is returned (0 when it did not run). */
static double config_updates(const bench_t *b, int i, int typical, double *upd_s)
{
    const result_t *r = &b->res[i];
    const double *v = typical ? r->upd_typ : r->upd_sum;
    double sum = 0;
    for (int l = 0; l < b->m.prof.nlayers; l++) {
        double u = r->ok_run && v && r->nrounds > 0 ? v[l] / r->nrounds : 0;
        if (upd_s)
            upd_s[l] = u;
        sum += u;
    }
    return sum;
}

/* The least update time any schedule must spend per iteration: a configuration's own with
 * sharded updates (each rank steps its slices), else its time over P (what sharding would
 * leave it), the smallest of those that ran. */
static double least_updates(const bench_t *b)
{
    double least = INFINITY;
    for (int i = 0; i < b->o.nconfigs; i++)
        if (b->res[i].ok_run)
            least = fmin(least, config_updates(b, i, 0, NULL) / (b->o.configs[i].shard ? 1 : bench_size));
    return isfinite(least) ? least : 0;
}

/* Configuration i's prediction: each round's plan simulated and the median taken, as the
 * measured time pools the rounds. Rounds that ran different plans are listed, each with its own
 * measured and predicted time, since the pooled figures then mix plans. */
static void predict_rounds(bench_t *b, int i, const double *upd_s)
{
    result_t *r = &b->res[i];
    const bench_config_t *c = &b->o.configs[i];
    /* Without kept plans (other ranks, a refused configuration): one prediction, of last_plan's. */
    int kept = r->plans && r->nrounds > 0, n = kept ? r->nrounds : 1, differ = 0, np = 0;
    const dear_plan_t *plans = kept ? r->plans : last_plan(r);
    double *p = malloc(sizeof(double) * (size_t)(2 * n)), *sorted = p ? p + n : NULL;
    if (!p)
        return;
    char first[96], brief[96];
    plan_brief(&plans[0], first, sizeof first);
    for (int k = 0; k < n; k++) {
        plan_brief(&plans[k], brief, sizeof brief);
        differ |= strcmp(brief, first) != 0;
        p[k] = NAN;
        /* The calibrated model made dearer by the factor the runtime fitted to training (it plans
         * with it only under DEAR_COST_REFIT=plan): the runtime's forecast of the plan. */
        double sc = kept && r->scales ? r->scales[k] : 1;
        b->fitted = b->model;
        if (sc != 1)
            dear_cost_mul(&b->fitted, sc);
        if (bench_predict(&b->m, &b->fitted, c, &b->o, &plans[k], upd_s, r->late_s, &p[k]) == DEAR_OK)
            sorted[np++] = p[k];
    }
    if (np > 0)
        r->pred_s = median(sorted, np);
    if (differ && !b->o.quiet) {
        bench_say("%s ran different plans in its rounds (its prediction: their median):\n", c->text);
        for (int k = 0; k < n; k++) {
            plan_brief(&plans[k], brief, sizeof brief);
            bench_say("  round %d: %-28s %9.3f ms, predicted %9.3f ms (%+.1f%%)\n", k + 1, brief, r->round_s[k] * 1e3,
                p[k] * 1e3, 100 * (p[k] - r->round_s[k]) / r->round_s[k]);
        }
    }
    free(p);
}

static void predict_configs(bench_t *b)
{
    double upd_least = least_updates(b);
    double *upd_s = malloc(sizeof(double) * (size_t)b->m.prof.nlayers);
    b->bound = bench_lower_bound(&b->m, &b->links, upd_least);
    if (!b->o.quiet) {
        bench_say("\n");
        if (bench_rank == 0)
            dear_cost_print(stdout, &b->model);
        bench_say("lower bound: %.3f ms (%d host(s), link %s)\n", b->bound * 1e3, b->links.hosts, b->links.source);
    }
    for (int i = 0; i < b->o.nconfigs; i++) {
        const bench_config_t *c = &b->o.configs[i];
        /* Sharded, the all-gathers carry parameters, which the runtime sends dense and uncompressed. */
        bench_model_price_sparse(&b->m, c->sparse, !c->shard);
        dear_prof_set_compress(&b->m.prof, -1, (dear_compress_t)c->comp_rs,
                               c->shard ? DEAR_COMPRESS_NONE : (dear_compress_t)c->comp_ag);
        b->bounds[i] = bench_lower_bound(&b->m, &b->links, upd_least);
        b->res[i].upd_s = config_updates(b, i, 0, NULL);
        /* Sharded, a layer's slices are mostly one rank's, whose time is the layer's: its median
         * rank's would drop them. */
        b->res[i].upd_typ_s = config_updates(b, i, !c->shard, upd_s);
        if (b->res[i].ok_run)
            b->res[i].late_s = dear_median(b->res[i].late, (size_t)b->res[i].nsamples);
        if (upd_s)
            predict_rounds(b, i, upd_s);
    }
    dear_prof_set_compress(&b->m.prof, -1, DEAR_COMPRESS_NONE, DEAR_COMPRESS_NONE);
    free(upd_s);
}

/* ---- results ---- */

static double it_q(double q_s, const result_t *r)
{
    return r->ok_run ? q_s * 1e3 : NAN;
}

static const char *csv_header = "model,np,config,schedule,fusion,threshold_bytes,iters,warmup,time_scale,size_scale,"
                                "grad_bytes,compute_ms,compute_meas_ms,iter_ms,iter_min_ms,iter_max_ms,exposed_ms,"
                                "blocked_ms,speedup_sync,speedup_wfbp64,pred_ms,pred_err_pct,bound_ms,iter_over_bound,"
                                "cost_model,check,iter_q1_ms,iter_q3_ms,plan,rs_buckets,ag_groups,ag_early,partition_bytes,units,"
                                "first_plan,startup_s,first_n,first_n_s,run_iters,run_s,update_ms,late_ms,period_ms,update_typ_ms";

/* References measured in this invocation: ref[0] sync, ref[1] wfbp + threshold 64 MiB with every
 * tensor whole (Horovod), both unsharded, dense and uncompressed; NAN when not run. */
static void reference_times(const bench_t *b, double ref[2])
{
    ref[0] = ref[1] = NAN;
    for (int i = 0; i < b->o.nconfigs; i++) {
        const bench_config_t *c = &b->o.configs[i];
        if (!b->res[i].ok_run)
            continue;
        int plain = !c->sparse && !c->shard && !c->comp_rs && !c->comp_ag;
        if (!strcmp(c->sched, "sync") && plain)
            ref[0] = b->res[i].iter_s;
        if (!strcmp(c->sched, "wfbp") && !strcmp(c->fusion, "threshold") && c->threshold == REF64M && plain &&
            c->partition == 0)
            ref[1] = b->res[i].iter_s;
    }
}

/* Rank 0: the CSV file with its header line, NULL without --csv (or when it cannot be written:
 * the run counts as broken). */
static FILE *open_csv(bench_t *b, dear_file_out_t *out)
{
    if (!b->o.csv || bench_rank != 0)
        return NULL;
    if (dear_file_out_open(out, b->o.csv, "CSV file") != DEAR_OK) {
        b->broken = 1;
        return NULL;
    }
    fprintf(out->f, "%s\n", csv_header);
    return out->f;
}

/* Configuration i's row of the table and, when csv, of the CSV file. */
static void report_config(const bench_t *b, int i, const double ref[2], FILE *csv)
{
    const result_t *r = &b->res[i];
    const bench_config_t *c = &b->o.configs[i];
    const bench_opts_t *o = &b->o;
    const dear_profile_t *p = &b->m.prof;
    double it = r->ok_run ? r->iter_s : NAN, per = r->ok_run ? r->period_s : NAN;
    /* The simulator gives the steady-state period, which the slowest rank's times overstate. */
    double err = 100 * (r->pred_s - per) / per;
    char vs[2][16];
    for (int k = 0; k < 2; k++) {
        if (isfinite(ref[k]) && r->ok_run)
            snprintf(vs[k], sizeof vs[k], "%.3fx", ref[k] / it);
        else
            snprintf(vs[k], sizeof vs[k], "-");
    }
    const dear_plan_t *pl = last_plan(r);
    char ran[96];
    plan_brief(pl, ran, sizeof ran);
    /* A run below its bound means the bound's link rate is too low: said, never hidden. */
    if (r->ok_run && it < b->bounds[i] && bench_rank == 0)
        fprintf(stderr, "dear-bench: warning: %s ran %.3f ms, below its lower bound %.3f ms (link %s): the link "
                        "carried more than that rate\n",
                c->text, it * 1e3, b->bounds[i] * 1e3, b->links.source);
    if (r->ok_run)
        bench_say("%-24s %9.3f %9.3f %9.3f %9.3f %9.3f %8s %8s %9.3f %+6.1f%% %8.3f %-5s %s\n", c->text, it * 1e3,
            per * 1e3, r->compute_s * 1e3, (it - r->compute_s) * 1e3, r->blocked_s * 1e3, vs[0], vs[1],
            r->pred_s * 1e3, err, it / b->bounds[i], r->status, ran);
    else
        bench_say("%-24s %9s %9s %9s %9s %9s %8s %8s %9.3f %7s %8s %s\n", c->text, "-", "-", "-", "-", "-", "-", "-",
            r->pred_s * 1e3, "-", "-", r->status);
    if (csv)
        fprintf(csv, "%s,%d,%s,%s,%s,%zu,%d,%d,%g,%g,%zu,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,"
                     "%.4f,%.4f,%s,%s,%.4f,%.4f,%s,%d,%d,%d,%zu,%d,%s,%.4f,%d,%.4f,%d,%.4f,%.4f,%.4f,%.4f,%.4f\n",
                p->model, bench_size, c->text, c->sched, c->fusion, bench_scaled_threshold(c, o), o->iters, c->warmup,
                o->time_scale, o->size_scale, dear_prof_bytes_total(p),
                (dear_prof_fwd_total(p) + dear_prof_bwd_total(p)) * 1e3, r->compute_s * 1e3, it * 1e3,
                r->iter_min_s * 1e3, r->iter_max_s * 1e3, (it - r->compute_s) * 1e3, r->blocked_s * 1e3, ref[0] / it,
                ref[1] / it, r->pred_s * 1e3, err, b->bounds[i] * 1e3, it / b->bounds[i], b->model.source,
                r->ok_run ? r->status : "refused", it_q(r->iter_q1_s, r), it_q(r->iter_q3_s, r),
                pl->ntensors > 0 ? pl->planner : "-", pl->rs.ngroups, pl->ag.ngroups, pl->ag_early,
                bench_scaled_partition(c, o), pl->nunits, c->first[0] ? c->first : "default", r->startup_s,
                o->first_n, r->first_n_s, r->run_iters, r->whole_s, r->upd_s * 1e3, r->late_s * 1e3, per * 1e3,
                r->upd_typ_s * 1e3);
}

static void free_results(bench_t *b)
{
    for (int i = 0; i < b->o.nconfigs; i++) {
        for (int k = 0; b->res[i].plans && k < b->res[i].nrounds; k++)
            dear_plan_free(&b->res[i].plans[k]);
        free(b->res[i].plans);
        free(b->res[i].scales);
        free(b->res[i].round_s);
        free(b->res[i].samples);
        free(b->res[i].comp);
        free(b->res[i].late);
        free(b->res[i].means);
        free(b->res[i].startup);
        free(b->res[i].first_n);
        free(b->res[i].whole);
        free(b->res[i].upd_sum);
        free(b->res[i].upd_typ);
    }
}

/* The table (rank 0), the CSV file, and the legend. */
static void report(bench_t *b)
{
    double ref[2];
    reference_times(b, ref);
    bench_say("\n%-24s %9s %9s %9s %9s %9s %8s %8s %9s %7s %8s %-5s %s\n", "config", "iter_ms", "period", "compute",
        "exposed", "blocked", "vs_sync", "vs_w64", "pred_ms", "err%", "/bound", "check", "plan run (buckets/groups/early, cut: tensors cut into chunks)");
    dear_file_out_t csv_out;
    FILE *csv = open_csv(b, &csv_out);
    for (int i = 0; i < b->o.nconfigs; i++)
        report_config(b, i, ref, csv);
    bench_say("\ntime to train, from dear_init (slowest rank, median over the rounds):\n%-28s %10s %14s %14s\n",
              "config", "startup_s", "first", "whole run");
    for (int i = 0; i < b->o.nconfigs; i++) {
        const result_t *r = &b->res[i];
        if (r->ok_run)
            bench_say("%-28s %10.3f %5d it %7.3f %5d it %7.3f\n", b->o.configs[i].text, r->startup_s, b->o.first_n,
                      r->first_n_s, r->run_iters, r->whole_s);
    }
    free_results(b);
    if (csv && dear_file_out_commit(&csv_out) != DEAR_OK)
        b->broken = 1;
    bench_say("iter_ms: median of the slowest rank's iterations; period: median of the ranks' mean iteration (the "
        "steady-state period, which jitter between the ranks leaves below the slowest rank's times); "
        "compute: measured emulated compute (sleep + gradient writes), nominal %.3f ms; exposed = iter - compute; "
        "blocked: application time blocked in libdear per iteration (dear_get_stats, slowest rank); vs_w64: over "
        "wfbp:threshold:64m with every tensor whole; pred: simulator with cost model %s (err%%: against the period; "
        "every collective dearer by the factor the runtime fitted to training, DEAR_COST_REFIT), "
        "each layer's measured update (SGD) time, the median rank's (sharded configurations: the slowest "
        "rank's), counted as forward compute (sharded under dear: stepped after the reduce-scatters, where the "
        "runtime steps them), and the last rank's lateness (late_ms in the CSV: how much after "
        "the median rank the last one ends its backward pass, median over the iterations) added to the backward "
        "pass; bound: what no schedule beats, the most of compute with the least update time any schedule "
        "needs (a sharded one's, or an unsharded one's over P) and, for each layer k, the compute of layers k.. "
        "plus the link time of layers 0..k\n",
        (dear_prof_fwd_total(&b->m.prof) + dear_prof_bwd_total(&b->m.prof)) * 1e3, b->model.source);
}

/* Exit status: 1 when a check failed or the run broke (as rank 0 saw it), else 3 when the
 * runtime refused a configuration, else 0. */
static int exit_status(bench_t *b)
{
    MPI_Bcast(&b->broken, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    if (b->failed_check || b->broken)
        return 1;
    return b->refused ? 3 : 0;
}

int main(int argc, char **argv)
{
    int provided;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &bench_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &bench_size);
    static bench_t b;
    default_stall_abort();
    int status = bench_parse_args(argc, argv, &b.o);
    if (status == 0)
        status = load_scaled_model(&b.o, &b.m);
    if (status != 0) {
        MPI_Finalize();
        return status < 0 ? 0 : status;
    }
    say_intro(&b);
    if (bench_measure_links(b.o.link_mbps, &b.links) != DEAR_OK) {
        bench_say("dear-bench: cannot measure the link rate for the lower bound (give --link-rate)\n");
        bench_model_free(&b.m);
        MPI_Finalize();
        return 2;
    }
    if (clock_offsets() != DEAR_OK) {
        bench_say("dear-bench: out of memory\n");
        bench_model_free(&b.m);
        MPI_Finalize();
        return 2;
    }
    open_runtime_calibration(&b);
    run_configs(&b);
    check_results(&b);
    if (load_prediction_model(&b) != DEAR_OK) {
        bench_model_free(&b.m);
        MPI_Finalize();
        return 2;
    }
    predict_configs(&b);
    report(&b);
    bench_model_free(&b.m);
    free(clock_off);
    return exit_status(&b);
}

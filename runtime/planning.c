/*
 * Fusion planning inside the runtime: the cost model at commit and the switch from the warm-up
 * plan to a model-driven one during training.
 *
 * At commit (dear_planning_setup), when DEAR_FUSION names a model-driven planner (mgwfbp, dp,
 * gradssa, auto), the schedule is not sync, no DEAR_PLAN_FILE is given and there are at least two
 * ranks, the runtime gets a cost model: DEAR_CALIBRATE=auto measures reduce-scatter, all-gather
 * and all-reduce as the collectives layer will run them (its selection table) on the context's
 * private communicator (seven sizes, each a stream of back-to-back collectives, the slowest
 * rank's mean per size, kept as an interpolated curve) unless DEAR_CALIBRATION_FILE already holds those curves
 * for this communicator size and ranks per host;
 * DEAR_CALIBRATE=off takes DEAR_COST_PRESET. The cache is read on rank 0 and the model
 * broadcast, so every rank plans from the same numbers. A corrupt cache is not fatal: it is
 * reported, kept as PATH.corrupt, measured again and replaced. This runs before the progress
 * thread starts, so the communicator is the application thread's alone.
 *
 * During training (dear_planning_replan, from dear_backward_end of iteration DEAR_WARMUP_ITERS
 * and then every DEAR_REPLAN_EVERY iterations) the caller has drained every collective of the
 * old plan; the progress thread is stopped, the per-layer medians are combined (slowest rank),
 * rank 0 plans and broadcasts, every rank rebuilds its buckets from the same plan and the
 * progress thread restarts with the new operation order. Because this happens on every rank at
 * the same backward_end, the global order of collectives stays identical across ranks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/cost.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "fusion/sim.h"
#include "runtime/check.h"
#include "runtime/params.h"
#include "runtime/rt.h"
#include "runtime/util.h"

/* Sizes from start-up dominated to bandwidth dominated, around the selection table's switch
 * from the direct exchange to the ring at 1 MiB. Each size is timed as a stream of back-to-back
 * collectives of at least CALIB_STREAM_BYTES (and CALIB_REPS), after an untimed CALIB_WARM_BYTES:
 * that is how the runtime's channel runs them, one behind the other, and a network with a burst
 * allowance (a token bucket, a switch's buffers: hundreds of KiB) carries a few small
 * collectives after an idle gap much faster than a stream of them. Timed alone, 64 KiB
 * all-gathers looked 3x cheaper than they ran in a 96-group all-gather phase on the emulated
 * cluster, and the planner cut the phase into groups that small. Every size is measured in
 * CALIB_PASSES passes over all sizes and collectives, and the median pass kept: on a shared
 * machine a stall of the host (tens of ms) inflates the one stream it falls into, and a single
 * pass priced a whole size 30-90% too high (the planner then avoided it, the simulator
 * mispredicted every plan using it by 25-50%). About 3-6 s for the three collectives on 4 hosts
 * at 1 Gbit/s (cache it: DEAR_CALIBRATION_FILE). The largest size sets the slope the curve is
 * extended with. */
static const size_t calib_bytes[] = { 8u << 10, 64u << 10, 256u << 10, 1u << 20, 2u << 20, 4u << 20, 8u << 20 };
#define CALIB_NSIZES ((int)(sizeof calib_bytes / sizeof calib_bytes[0]))
#define CALIB_REPS 5
#define CALIB_STREAM_BYTES ((size_t)4 << 20)
#define CALIB_WARM_BYTES ((size_t)1 << 20)
#define CALIB_MAX_REPS 512
#define CALIB_PASSES 3

static const dear_coll_op_t coll_of_cost[DEAR_COST_NOPS] = { DEAR_COLL_REDUCE_SCATTER, DEAR_COLL_ALLGATHER,
                                                             DEAR_COLL_ALLREDUCE };

static void log_model(const dear_ctx_t *ctx, const char *how)
{
    if (!DEAR_LOG_ON(DEAR_LOG_INFO) || ctx->rank != 0) /* the same on every rank: printed once */
        return;
    DEAR_INFO("plan", "cost model (%s) for P=%d, %d rank(s) per host: %s", ctx->cost.source, ctx->cost.comm_size,
              ctx->cost.ranks_per_host, how);
    for (int op = 0; op < DEAR_COST_NOPS; op++)
        for (int a = 0; a < DEAR_COST_NALGOS; a++) {
            const dear_cost_line_t *l = &ctx->cost.line[op][a];
            if (!l->valid)
                continue;
            DEAR_INFO("plan", "  %s %-4s alpha %.2f us, beta %.4f ns/B (%.0f MB/s), gamma %.4f ns/B, fit error %.1f%% "
                              "over %d sample(s)%s",
                      dear_cost_op_name((dear_cost_op_t)op), dear_cost_algo_name((dear_cost_algo_t)a), 1e6 * l->alpha,
                      1e9 * l->beta, l->beta > 0 ? 1e-6 / l->beta : 0.0, 1e9 * l->gamma, 100 * l->fit_err,
                      l->nsamples, l->npts >= 2 ? "; priced by the curve through the samples" : "");
            for (int i = 0; i < l->npts; i++)
                DEAR_INFO("plan", "    %.0f B: %.1f us (%.0f MB/s)", l->pt_bytes[i], 1e6 * l->pt_sec[i],
                          l->pt_sec[i] > 0 ? 1e-6 * l->pt_bytes[i] / l->pt_sec[i] : 0.0);
        }
}

static int reps_for(size_t bytes, size_t volume, int least)
{
    size_t r = (volume + bytes - 1) / bytes;
    return r < (size_t)least ? least : r > CALIB_MAX_REPS ? CALIB_MAX_REPS : (int)r;
}

/* One (collective, size) sample: the barrier lines the ranks up, an untimed stream fills the
 * pipes and drains any burst allowance, then a timed stream of back-to-back collectives gives the
 * mean seconds per collective in the steady state (what the planner's FIFO channel assumes).
 * DEAR_ERR_UNSUPPORTED from start (size limits) is returned without logging: the same on every
 * rank, it only means the size is skipped. */
static int time_run(dear_ctx_t *ctx, dear_coll_args_t *args, size_t bytes, double *seconds)
{
    DEAR_MPI_CHECK(MPI_Barrier(ctx->comm));
    int warm = reps_for(bytes, CALIB_WARM_BYTES, 1), reps = reps_for(bytes, CALIB_STREAM_BYTES, CALIB_REPS);
    double t0 = 0;
    for (int r = -warm; r < reps; r++) {
        if (r == 0)
            t0 = dear_now();
        dear_coll_req_t *req = NULL;
        int rc = dear_coll_start(args, &req);
        if (rc != DEAR_OK)
            return rc;
        rc = dear_coll_wait(req);
        dear_coll_free(req);
        if (rc != DEAR_OK)
            return rc;
    }
    *seconds = (dear_now() - t0) / reps;
    return DEAR_OK;
}

/* Measure each collective as the runtime will run it (DEAR_ALGO_AUTO: the selection table, or
 * the algorithm DEAR_COLL_ALGO forces) at every calibration size, and keep the median pass's
 * means as the auto curve of the model; the model is the same on every rank (rank 0 takes the
 * slowest rank's samples and broadcasts). A straight line per algorithm, as the model had before, priced
 * buckets of 2-25 MiB from a fit dominated by the small sizes (off by 20-50% on a 1 Gbit/s
 * link) and with algorithms the selection table never runs there. */
static int calibrate(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    size_t maxb = calib_bytes[CALIB_NSIZES - 1];
    size_t count = maxb / sizeof(float);
    float *buf = NULL;
    double *t = NULL, *tmax = NULL;
    size_t nk = (size_t)DEAR_COST_NOPS * CALIB_NSIZES, nt = nk * CALIB_PASSES; /* t[pass * nk + k] */
    double t_start = dear_now();

    DEAR_ALLOC_GOTO(buf, malloc(maxb), maxb, rc, out);
    DEAR_ALLOC_GOTO(t, calloc(nt, sizeof *t), nt * sizeof *t, rc, out);
    DEAR_ALLOC_GOTO(tmax, calloc(nt, sizeof *tmax), nt * sizeof *tmax, rc, out);
    for (size_t i = 0; i < count; i++)
        buf[i] = 1.0f;
    for (int pass = 0; pass < CALIB_PASSES; pass++)
        for (int op = 0; op < DEAR_COST_NOPS; op++)
            for (int s = 0; s < CALIB_NSIZES; s++) {
                dear_coll_args_t args = { 0 };
                args.op = coll_of_cost[op];
                args.algo = DEAR_ALGO_AUTO;
                args.dtype = DEAR_FLOAT32;
                args.comm = ctx->comm;
                args.topo = ctx->coll_topo;
                args.tag = 0; /* nothing else runs on the communicator before commit ends */
                args.scale = op == DEAR_COST_AG ? 1.0 : 1.0 / ctx->size; /* values stay 1 */
                args.recvbuf = buf;
                args.count = calib_bytes[s] / sizeof(float);
                size_t k = (size_t)pass * nk + (size_t)op * CALIB_NSIZES + (size_t)s;
                int r1 = time_run(ctx, &args, calib_bytes[s], &t[k]);
                if (r1 == DEAR_ERR_UNSUPPORTED) {
                    t[k] = -1; /* this size is beyond the algorithm: no sample */
                    continue;
                }
                if (r1 != DEAR_OK) {
                    DEAR_ERROR("plan", "calibration: %s on %zu bytes failed: %s", dear_cost_op_name((dear_cost_op_t)op),
                               calib_bytes[s], dear_status_string(r1));
                    rc = r1;
                    goto out;
                }
            }
    DEAR_MPI_CHECK_GOTO(MPI_Reduce(t, tmax, (int)nt, MPI_DOUBLE, MPI_MAX, 0, ctx->comm), rc, out);
    if (ctx->rank == 0) {
        dear_cost_model_t m;
        memset(&m, 0, sizeof m);
        m.comm_size = ctx->size;
        m.ranks_per_host = ctx->topo.max_local_size;
        snprintf(m.source, sizeof m.source, "fit");
        for (int op = 0; op < DEAR_COST_NOPS; op++) {
            double xs[CALIB_NSIZES], ys[CALIB_NSIZES];
            int n = 0;
            for (int s = 0; s < CALIB_NSIZES; s++) {
                double pv[CALIB_PASSES], lo = INFINITY, hi = 0;
                for (int pass = 0; pass < CALIB_PASSES; pass++) {
                    pv[pass] = tmax[(size_t)pass * nk + (size_t)op * CALIB_NSIZES + (size_t)s];
                    lo = pv[pass] < lo ? pv[pass] : lo;
                    hi = pv[pass] > hi ? pv[pass] : hi;
                }
                if (pv[0] < 0) /* beyond the algorithm, in every pass alike */
                    continue;
                double v = dear_median(pv, CALIB_PASSES);
                xs[n] = (double)calib_bytes[s];
                ys[n++] = v;
                DEAR_DEBUG("plan", "calibration: %s %zu B: %.1f us per collective over a stream of %d (slowest rank, "
                                   "median of %d passes, %.1f..%.1f us)",
                           dear_cost_op_name((dear_cost_op_t)op), calib_bytes[s], 1e6 * v,
                           reps_for(calib_bytes[s], CALIB_STREAM_BYTES, CALIB_REPS), CALIB_PASSES,
                           1e6 * lo, 1e6 * hi);
            }
            if (n < 2 || dear_cost_fit_curve(xs, ys, n, &m.line[op][DEAR_COST_AUTO]) != DEAR_OK)
                DEAR_WARN("plan", "calibration: %d usable size(s) of %s, no curve: that collective is priced "
                                  "as infinitely expensive",
                          n, dear_cost_op_name((dear_cost_op_t)op));
        }
        ctx->cost = m;
    }
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&ctx->cost, (int)sizeof ctx->cost, MPI_BYTE, 0, ctx->comm), rc, out);
    ctx->calib_measured++;
    DEAR_INFO("plan", "calibration: measured %d size(s) per collective, each as a stream of at least %zu bytes, "
                      "median of %d passes, in %.3f s",
              CALIB_NSIZES, CALIB_STREAM_BYTES, CALIB_PASSES, dear_now() - t_start);
out:
    free(buf);
    free(t);
    free(tmax);
    return rc;
}

/* 1 if model has the auto curve of every collective (what calibrate measures). */
static int model_covers(const dear_cost_model_t *m)
{
    for (int op = 0; op < DEAR_COST_NOPS; op++)
        if (!m->line[op][DEAR_COST_AUTO].valid)
            return 0;
    return 1;
}

/* DEAR_CALIBRATE=auto: the cache (rank 0 reads, everyone receives), else a measurement. */
static int cost_calibrated(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    const char *path = dear_param_string(DEAR_P_CALIBRATION_FILE);
    int use_file = path && path[0];
    int verdict = 0; /* rank 0's: 1 cache hit, 0 measure, 2 measure and replace a corrupt file */
    if (ctx->rank == 0 && use_file) {
        dear_cost_model_t m;
        int found = 0;
        int lrc = dear_cost_load(path, ctx->size, ctx->topo.max_local_size, &m, &found);
        if (lrc == DEAR_ERR_FORMAT) {
            DEAR_WARN("plan", "DEAR_CALIBRATION_FILE=%s is corrupt (the error above names the line): measuring "
                              "again; the file is kept as %s.corrupt and a new one is written",
                      path, path);
            verdict = 2;
        } else if (lrc != DEAR_OK) {
            DEAR_WARN("plan", "DEAR_CALIBRATION_FILE=%s cannot be read (%s): measuring again", path,
                      dear_status_string(lrc));
        } else if (found > 0 && model_covers(&m)) {
            ctx->cost = m;
            verdict = 1;
        }
    }
    DEAR_MPI_CHECK(MPI_Bcast(&verdict, 1, MPI_INT, 0, ctx->comm));
    if (verdict == 1) {
        DEAR_MPI_CHECK(MPI_Bcast(&ctx->cost, (int)sizeof ctx->cost, MPI_BYTE, 0, ctx->comm));
        log_model(ctx, "loaded from the calibration cache, nothing measured");
        return DEAR_OK;
    }
    DEAR_CHECK(calibrate(ctx));
    log_model(ctx, "measured at commit");
    if (ctx->rank == 0 && use_file) {
        if (verdict == 2) {
            char bad[4200];
            snprintf(bad, sizeof bad, "%s.corrupt", path);
            if (rename(path, bad) != 0)
                DEAR_WARN("plan", "cannot move the corrupt %s aside to %s", path, bad);
        }
        rc = dear_cost_save(path, &ctx->cost);
        if (rc != DEAR_OK)
            DEAR_WARN("plan", "DEAR_CALIBRATION_FILE=%s: cannot save the fitted model (%s); the next run measures "
                              "again",
                      path, dear_status_string(rc));
    }
    return DEAR_OK;
}

int dear_planning_setup(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    /* Rank 0's settings decide, as its plan does: ranks with different environments still agree
     * on whether and when to plan. */
    const char *fusion = dear_param_string(DEAR_P_FUSION);
    const char *pfile = dear_param_string(DEAR_P_PLAN_FILE);
    int cfg[5];
    cfg[0] = (strcmp(fusion, "mgwfbp") == 0 || strcmp(fusion, "dp") == 0 || strcmp(fusion, "gradssa") == 0 ||
              strcmp(fusion, "auto") == 0) &&
             ctx->sched != DEAR_SCHED_SYNC && !(pfile && pfile[0]) && ctx->size > 1;
    cfg[1] = (int)dear_param_int(DEAR_P_WARMUP_ITERS);
    cfg[2] = (int)dear_param_int(DEAR_P_REPLAN_EVERY);
    cfg[3] = (int)dear_param_enum(DEAR_P_CALIBRATE); /* auto|off */
    /* Only auto promises the fastest plan it can find; a named planner's plan is kept. */
    cfg[4] = strcmp(fusion, "auto") == 0 ? (int)dear_param_int(DEAR_P_VERIFY_ITERS) : 0;
    DEAR_MPI_CHECK(MPI_Bcast(cfg, 5, MPI_INT, 0, ctx->comm));
    ctx->online = cfg[0];
    ctx->replan_every = cfg[2];
    ctx->next_plan_iter = ctx->online ? cfg[1] : -1;
    ctx->verify_iters = cfg[4];
    ctx->verify_at = -1;
    if (!ctx->online)
        return DEAR_OK;
    if (cfg[3] == 0) {
        rc = cost_calibrated(ctx);
    } else {
        char name[32];
        if (ctx->rank == 0)
            snprintf(name, sizeof name, "%s", dear_param_string(DEAR_P_COST_PRESET));
        DEAR_MPI_CHECK(MPI_Bcast(name, (int)sizeof name, MPI_CHAR, 0, ctx->comm));
        rc = dear_cost_preset(name, ctx->size, ctx->topo.max_local_size, &ctx->cost);
        if (rc == DEAR_OK)
            log_model(ctx, "DEAR_CALIBRATE=off, from DEAR_COST_PRESET");
    }
    /* Every rank computed or received the same model; a failure on one is a failure on all. */
    int any = rc != DEAR_OK, all = 0;
    DEAR_MPI_CHECK(MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, ctx->comm));
    if (all && rc == DEAR_OK) {
        DEAR_ERROR("plan", "dear_commit: another rank could not build the cost model; see its message");
        rc = DEAR_ERR_INTERNAL;
    }
    if (rc == DEAR_OK)
        DEAR_INFO("plan", "online planning: planner %s after %d warm-up iteration(s)%s", fusion, cfg[1],
                  cfg[2] > 0 ? ", then again periodically (DEAR_REPLAN_EVERY)" : "");
    return rc;
}

/* Rank 0: the profile of the last iterations (slowest rank's medians). */
static int build_profile(const dear_ctx_t *ctx, const double *med, dear_profile_t *prof)
{
    int rc = DEAR_OK;
    char msg[256];
    dear_prof_init(prof, "online");
    for (int l = 0; l < ctx->nlayers && rc == DEAR_OK; l++)
        rc = dear_prof_add_layer(prof, ctx->layers[l].id, med[2 * l], med[2 * l + 1]);
    for (int t = 0; t < ctx->ntensors && rc == DEAR_OK; t++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", t);
        rc = dear_prof_add_tensor(prof, name, ctx->tensors[t].layer, ctx->tensors[t].bytes);
    }
    if (rc == DEAR_OK && (rc = dear_prof_check(prof, msg, sizeof msg)) != DEAR_OK)
        DEAR_ERROR("plan", "online planning: the measured profile is rejected: %s", msg);
    return rc;
}

static double predict(const dear_plan_problem_t *prob, const dear_plan_t *plan)
{
    dear_sim_result_t r = { 0 };
    if (dear_sim_run(prob->prof, &prob->cost, prob->sched, plan, 0, &r) != DEAR_OK)
        return INFINITY;
    return r.iter_s;
}

/* Rank 0: plan from the medians; logs the choice against the threshold plan. */
static int plan_rank0(dear_ctx_t *ctx, const double *med, dear_plan_t *plan)
{
    int rc;
    dear_profile_t prof;
    dear_plan_problem_t prob;
    dear_sim_model_arg_t marg;
    dear_plan_t thr = { 0 };
    const char *fusion = dear_param_string(DEAR_P_FUSION);
    double t0 = dear_now();

    memset(&prof, 0, sizeof prof);
    rc = build_profile(ctx, med, &prof);
    if (rc == DEAR_OK)
        rc = dear_plan_problem_init(&prob, &prof, (dear_sim_sched_t)ctx->sched, &ctx->cost, 0, &marg);
    if (rc == DEAR_OK) {
        prob.threshold = (size_t)dear_param_int(DEAR_P_FUSION_THRESHOLD);
        prob.seed = (uint64_t)dear_param_int(DEAR_P_SEED);
        rc = dear_plan_by_name(plan, &prob, fusion);
        if (rc != DEAR_OK)
            DEAR_ERROR("plan", "online planning: planner %s failed for %d tensors: %s", fusion, ctx->ntensors,
                       dear_status_string(rc));
    }
    if (rc == DEAR_OK && DEAR_LOG_ON(DEAR_LOG_INFO)) {
        double tnew = predict(&prob, plan), tcur = predict(&prob, &ctx->plan), tthr = INFINITY;
        if (dear_plan_by_name(&thr, &prob, "threshold") == DEAR_OK)
            tthr = predict(&prob, &thr);
        DEAR_INFO("plan", "online plan at iteration %lld (%s, schedule %s): %s with %d reduce-scatter bucket(s) "
                          "and %d all-gather group(s); predicted iteration %.3f ms vs %.3f ms with threshold "
                          "(%zu B) and %.3f ms with the current plan (%s, %d bucket(s)); compute %.3f ms; planned "
                          "in %.1f ms",
                  ctx->iter, fusion, dear_sched_name(ctx->sched), plan->planner, plan->rs.ngroups, plan->ag.ngroups,
                  1e3 * tnew, 1e3 * tthr, prob.threshold, 1e3 * tcur, ctx->plan.planner, ctx->plan.rs.ngroups,
                  1e3 * (dear_prof_fwd_total(&prof) + dear_prof_bwd_total(&prof)), 1e3 * (dear_now() - t0));
    }
    dear_plan_free(&thr);
    dear_prof_free(&prof);
    return rc;
}

/* After a plan switch or check (the progress thread stopped): a failure stops the context
 * (later hooks say so); otherwise the progress thread restarts with the operation order of the
 * plan in place, from this iteration on every rank. */
static int engine_restart(dear_ctx_t *ctx, int rc)
{
    if (rc != DEAR_OK) {
        ctx->engine_rc = rc;
        ctx->next_plan_iter = -1;
        ctx->verify_at = -1;
    }
    if (ctx->nops > 0) {
        ctx->next_seq = ctx->iter * ctx->nops;
        int src = dear_engine_start(ctx);
        if (src != DEAR_OK && rc == DEAR_OK)
            rc = ctx->engine_rc = src;
    }
    return rc;
}

int dear_planning_replan(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    double *med = NULL, *all = NULL;
    dear_plan_t plan = { 0 };

    /* The caller drained the old plan's collectives: with the thread stopped, the communicator
     * is this thread's alone and the operations can be rebuilt. */
    dear_engine_stop(ctx);
    ctx->stop = 0;
    size_t bytes = sizeof(double) * 2 * (size_t)ctx->nlayers;
    DEAR_ALLOC_GOTO(med, malloc(bytes), bytes, rc, out);
    DEAR_ALLOC_GOTO(all, malloc(bytes), bytes, rc, out);
    for (int l = 0; l < ctx->nlayers; l++) {
        med[2 * l] = dear_samples_median(&ctx->fwd_times[l]);
        med[2 * l + 1] = dear_samples_median(&ctx->bwd_times[l]);
    }
    /* A plan must fit the slowest worker. */
    DEAR_MPI_CHECK_GOTO(MPI_Reduce(med, all, 2 * ctx->nlayers, MPI_DOUBLE, MPI_MAX, 0, ctx->comm), rc, out);
    if (ctx->rank == 0)
        rc = plan_rank0(ctx, all, &plan);
    /* Switch only after this; a planner failure keeps the plan that works (communication
     * errors stop the context as usual). */
    ctx->next_plan_iter = ctx->replan_every > 0 ? ctx->iter + ctx->replan_every : -1;
    rc = dear_model_bcast_plan(ctx, &plan, rc);
    if (rc == DEAR_ERR_MPI || rc == DEAR_ERR_NOMEM)
        goto out;
    if (rc != DEAR_OK) {
        DEAR_WARN("plan", "online planning at iteration %lld failed (%s); keeping plan %s", ctx->iter,
                  dear_status_string(rc), ctx->plan.planner);
        rc = DEAR_OK;
        goto out;
    }
    if (!dear_plan_equal(&plan, &ctx->plan)) {
        /* Keep the plan being replaced, and how fast it ran, for the check DEAR_VERIFY_ITERS
         * iterations from now (the first iteration on the new plan is left out: the switch
         * drained the pipeline). */
        dear_plan_t prev = { 0 };
        DEAR_CHECK_GOTO(dear_plan_copy(&prev, &ctx->plan), rc, out);
        DEAR_CHECK_GOTO(dear_model_rebuild(ctx, &plan), rc, out_prev);
        if (ctx->verify_iters > 0) {
            dear_plan_free(&ctx->prev_plan);
            ctx->prev_plan = prev;
            prev = (dear_plan_t){ 0 };
            ctx->prev_iter_s = dear_samples_min_tail(&ctx->iter_times, (size_t)ctx->verify_iters);
            dear_samples_free(&ctx->verify_times);
            ctx->verify_at = ctx->iter + 1 + ctx->verify_iters;
        }
out_prev:
        dear_plan_free(&prev);
        if (rc != DEAR_OK)
            goto out;
    } else {
        /* Same buckets: keep them, but record who confirmed them. */
        snprintf(ctx->plan.planner, sizeof ctx->plan.planner, "%s", plan.planner);
        DEAR_INFO("plan", "online plan at iteration %lld: unchanged (%d bucket(s))", ctx->iter, ctx->nbuckets);
    }
    ctx->nplans++;
out:
    rc = engine_restart(ctx, rc);
    dear_plan_free(&plan);
    free(med);
    free(all);
    return rc;
}

/* A new plan must beat the one it replaced by measurement as well as by prediction: the
 * simulator prices each collective by its mean cost alone and the links' jitter (a tight plan
 * has no slack to absorb it) or a collective the calibration flattered can make a predicted
 * win a measured loss. Each plan is represented by its best iteration of the window: a stall of
 * the machine only ever adds time, and one during the new plan's few iterations (seen on the
 * emulated cluster: a 2.4 s iteration among 0.9 s ones) must not send a good plan back. Both are
 * the slowest rank's. */
#define VERIFY_TOLERANCE 0.02

int dear_planning_verify(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    dear_engine_stop(ctx);
    ctx->stop = 0;
    double mine[2] = { ctx->prev_iter_s, dear_samples_min_tail(&ctx->verify_times, ctx->verify_times.n) }, slowest[2];
    ctx->verify_at = -1;
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(mine, slowest, 2, MPI_DOUBLE, MPI_MAX, ctx->comm), rc, out);
    if (slowest[1] > slowest[0] * (1 + VERIFY_TOLERANCE)) {
        DEAR_INFO("plan", "plan %s measured %.3f ms per iteration (best of its check), the plan %s it replaced "
                          "%.3f ms: going back to it (DEAR_VERIFY_ITERS)",
                  ctx->plan.planner, 1e3 * slowest[1], ctx->prev_plan.planner, 1e3 * slowest[0]);
        DEAR_CHECK_GOTO(dear_model_rebuild(ctx, &ctx->prev_plan), rc, out);
        ctx->nreverts++;
    } else {
        DEAR_INFO("plan", "plan %s measured %.3f ms per iteration (best of its check), the plan %s it replaced "
                          "%.3f ms: kept",
                  ctx->plan.planner, 1e3 * slowest[1], ctx->prev_plan.planner, 1e3 * slowest[0]);
    }
out:
    dear_plan_free(&ctx->prev_plan);
    dear_samples_free(&ctx->verify_times);
    return engine_restart(ctx, rc);
}

/*
 * The plan inside the runtime: the one in force at commit, made on rank 0 and broadcast (a
 * planner with any rank-dependent behaviour still yields one plan), and the switch from that
 * warm-up plan to a model-driven one during training.
 *
 * Online planning runs when DEAR_FUSION names a model-driven planner (DEAR_PLANNER_F_MODEL), the
 * schedule is not sync, no DEAR_PLAN_FILE is given and there are at least two ranks; commit then
 * gets the cost model (calibrate.c) and, with no profile yet, plans from the model's structure
 * (DEAR_FIRST_PLAN, fusion/estimate.h): across the unknown scale at commit and, for `first`,
 * again at the first backward_end with that iteration's measured totals. At the backward_end of
 * iteration DEAR_WARMUP_ITERS (and every DEAR_REPLAN_EVERY iterations after it) the caller has
 * drained every collective of the old plan; the progress thread is stopped, rank 0 plans from
 * the measured profile (slowest rank) and broadcasts, every rank rebuilds its buckets from the
 * same plan and the progress thread restarts with the new operation order. Because this happens on every rank at the same
 * backward_end, the global order of collectives stays identical across ranks. auto then checks
 * its plan against the one it replaced by measurement (DEAR_VERIFY_ITERS, below).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/cost.h"
#include "fusion/estimate.h"
#include "fusion/planfile.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "fusion/sim.h"
#include "fusion/units.h"
#include "base/mpi_check.h"
#include "base/params.h"
#include "runtime/rt.h"
#include "base/util.h"

/* ---- the plan at commit ---- */

/* The structure of the registered model cut into the units, its compute spread by the layers'
 * costs over the totals (fwd_s, bwd_s): what plans are made from before any profile. */
static int estimated_units(const dear_ctx_t *ctx, int nunits, const dear_unit_t *units, double fwd_s,
                           double bwd_s, dear_profile_t *out)
{
    dear_profile_t st = { 0 }, est = { 0 };
    int rc = dear_profile_structure(ctx, &st);
    if (rc == DEAR_OK)
        rc = dear_prof_estimate(&st, fwd_s, bwd_s, &est);
    if (rc == DEAR_OK)
        rc = dear_prof_units(&est, nunits, units, out);
    dear_prof_free(&st);
    dear_prof_free(&est);
    return rc;
}

/* What the context adds to a planning problem. Sharded: a parameter leaves after its update,
 * during backward only when slices are stepped there, and then behind the hook that steps them.
 * Sparse: the exchange is spread over hier's curves only on hosts alike (hier serves no others);
 * elsewhere the curves are the flat ring's, which price its bytes as they are. */
static void context_problem(const dear_ctx_t *ctx, dear_plan_problem_t *prob)
{
    prob->shard = !dear_shard_on(ctx)          ? DEAR_SIM_SHARD_NONE
                  : dear_shard_steps_early(ctx) ? DEAR_SIM_SHARD_EARLY
                                                : DEAR_SIM_SHARD_END;
    prob->no_early = prob->shard == DEAR_SIM_SHARD_END;
    prob->cost.spread = dear_coll_sparse_copies(DEAR_COLL_REDUCE_SCATTER, DEAR_FLOAT32, (size_t)1 << 20,
                                                ctx->cm.size, ctx->cm.coll_topo);
}

/* Rank 0 at commit: the plan of the model-driven planner from the structure alone, the one that
 * loses least across the compute-to-communication ratios (the scale is unknown), or the threshold
 * plan when that one is not predicted faster than it by DEAR_FIRST_MIN_GAIN at compute =
 * communication. Why: the estimate guesses the spread of compute and prices collectives
 * calibrated alone, so a smaller predicted gain lies within its error, and the threshold plan is
 * what training started on before; the middle of the range is where the plan matters most (far
 * from it compute or communication hides the other whatever the plan). */
static int estimate_plan(dear_ctx_t *ctx, int nunits, const dear_unit_t *units, const dear_tensor_desc_t *udesc,
                         dear_plan_t *plan)
{
    dear_profile_t prof = { 0 };
    dear_plan_problem_t prob;
    dear_sim_model_arg_t marg;
    dear_plan_t thr = { 0 };
    dear_first_start_t start = { .gain = NAN };
    double t0 = dear_now(), regret = NAN;
    int hinted = 0;
    for (int l = 0; l < ctx->reg.nlayers; l++)
        hinted += ctx->reg.layers[l].flops >= 0;
    size_t thr_bytes = (size_t)dear_param_int(DEAR_P_FUSION_THRESHOLD);
    int rc = estimated_units(ctx, nunits, units, 1.0, 2.0, &prof);
    if (rc == DEAR_OK)
        rc = dear_plan_problem_init(&prob, &prof, ctx->cfg.sched, &ctx->online.cost, 0, &marg);
    if (rc == DEAR_OK) {
        prob.threshold = thr_bytes;
        prob.seed = (uint64_t)dear_param_int(DEAR_P_SEED);
        context_problem(ctx, &prob);
        dear_robust_range_t range = { DEAR_ROBUST_LO, DEAR_ROBUST_HI, DEAR_ROBUST_POINTS };
        rc = dear_plan_robust(plan, &prob, (dear_planner_t)dear_param_enum(DEAR_P_FUSION), &range, &regret);
    }
    if (rc == DEAR_OK)
        rc = dear_plan_threshold(&thr, nunits, udesc, thr_bytes);
    /* same = 0: an equal plan under the margin still starts under the threshold plan's name. */
    if (rc == DEAR_OK)
        rc = dear_first_start(&prob, plan, &thr, 1.0, ctx->online.first_min_gain, 0, &start);
    if (rc == DEAR_OK)
        DEAR_INFO("plan", "first plan, from the model's structure (%d of %d layer(s) with a compute hint, the others "
                          "by parameter bytes) and the cost model: %s with %d reduce-scatter bucket(s) and %d "
                          "all-gather group(s), within %.1f%% of the best plan at every compute/communication ratio "
                          "%g..%g, predicted %.1f%% faster than the threshold plan at compute = communication; "
                          "planned in %.1f ms",
                  hinted, ctx->reg.nlayers, plan->planner, plan->rs.ngroups, plan->ag.ngroups, 100 * (regret - 1),
                  DEAR_ROBUST_LO, DEAR_ROBUST_HI, 100 * start.gain, 1e3 * (dear_now() - t0));
    if (rc == DEAR_OK && start.threshold) {
        DEAR_INFO("plan", "first plan: %s predicted %.1f%% faster than the threshold plan, under DEAR_FIRST_MIN_GAIN="
                          "%g: training starts on the threshold plan (%zu B)",
                  plan->planner, 100 * start.gain, ctx->online.first_min_gain, thr_bytes);
        dear_plan_free(plan);
        *plan = thr;
        thr = (dear_plan_t){ 0 };
        snprintf(plan->planner, sizeof plan->planner, "threshold(warm-up)");
    }
    dear_plan_free(&thr);
    dear_prof_free(&prof);
    return rc;
}

/* Rank 0's plan at commit, over the units DEAR_PARTITION cuts the tensors into (fusion/units.h),
 * or the DEAR_PLAN_FILE plan with the units it was made for. */
static int make_plan(dear_ctx_t *ctx, dear_plan_t *plan)
{
    int rc = DEAR_OK, n = ctx->reg.ntensors, nu = 0;
    dear_tensor_desc_t *desc = NULL, *udesc = NULL;
    dear_unit_t *units = NULL;
    const char **names = NULL;
    DEAR_CHECK_GOTO(dear_tensor_table(ctx, &desc, &names), rc, out);
    const char *pfile = dear_param_string(DEAR_P_PLAN_FILE);
    if (pfile && pfile[0] && ctx->cfg.sched != DEAR_SCHED_SYNC) {
        /* A fixed plan (dear-plan's output), checked against the registered tensors. */
        rc = dear_planfile_load(pfile, n, desc, names, plan);
        if (rc == DEAR_ERR_MISMATCH)
            DEAR_ERROR("plan", "DEAR_PLAN_FILE=%s does not fit the registered tensors (the message above says "
                               "where); make the plan again for this model (dear-plan, dear_plan_save)",
                       pfile);
        else if (rc != DEAR_OK)
            DEAR_ERROR("plan", "DEAR_PLAN_FILE=%s: cannot use this plan (%s); see the message above", pfile,
                       dear_status_string(rc));
        else if (!plan->planner[0])
            snprintf(plan->planner, sizeof plan->planner, "file");
        goto out;
    }
    size_t partition = dear_partition_bytes(ctx);
    DEAR_CHECK_GOTO(dear_units_cut(n, desc, partition, &units, &nu), rc, out);
    DEAR_CHECK_GOTO(dear_units_descs(n, desc, nu, units, &udesc), rc, out);
    const char *fusion = dear_param_string(DEAR_P_FUSION);
    dear_planner_t planner = (dear_planner_t)dear_param_enum(DEAR_P_FUSION);
    if (ctx->cfg.sched == DEAR_SCHED_SYNC) {
        /* One all-reduce of everything: the baseline without overlap. */
        int first[2] = { 0, nu };
        rc = dear_plan_same(plan, nu, 1, first, "sync");
    } else if (planner == DEAR_PLANNER_NONE) {
        rc = dear_plan_none(plan, nu, udesc);
    } else {
        /* Model-driven planners plan from the measured profile once the warm-up iterations have
         * given one; until then the model's structure stands in for it (DEAR_FIRST_PLAN), or
         * the threshold plan runs. On one rank a model-driven planner has nothing to plan: no
         * communication at all. */
        if (ctx->online.enabled && ctx->online.first_plan != DEAR_FIRST_THRESHOLD) {
            rc = estimate_plan(ctx, nu, units, udesc, plan);
        } else {
            rc = dear_plan_threshold(plan, nu, udesc, (size_t)dear_param_int(DEAR_P_FUSION_THRESHOLD));
            if (rc == DEAR_OK && ctx->online.enabled)
                snprintf(plan->planner, sizeof plan->planner, "threshold(warm-up)");
        }
    }
    if (rc == DEAR_OK)
        rc = dear_plan_set_units(plan, n, units);
    if (rc != DEAR_OK)
        DEAR_ERROR("plan", "planner %s failed for %d tensors in %d units: %s", fusion, n, nu, dear_status_string(rc));
    else if (nu > n)
        DEAR_INFO("plan", "DEAR_PARTITION=%zu cuts %d tensor(s) into %d unit(s)", partition, n, nu);
out:
    free(desc);
    free(udesc);
    free(units);
    free(names);
    return rc;
}

/* Rank 0 plans and broadcasts, so a planner with any rank-dependent behaviour (timings, floating
 * point) still yields one plan. The verdict travels with it, so a failing planner fails everywhere. */
static int bcast_partition(dear_ctx_t *ctx, dear_partition_t *p, int nunits)
{
    int rc = DEAR_OK, ng = p->ngroups;
    int *first = NULL;
    DEAR_MPI_CHECK(MPI_Bcast(&ng, 1, MPI_INT, 0, ctx->cm.comm));
    DEAR_ALLOC_GOTO(first, malloc(sizeof(int) * (size_t)(ng + 1)), sizeof(int) * (size_t)(ng + 1), rc, out);
    if (ctx->cm.rank == 0)
        memcpy(first, p->first, sizeof(int) * (size_t)(ng + 1));
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(first, ng + 1, MPI_INT, 0, ctx->cm.comm), rc, out);
    if (ctx->cm.rank != 0)
        rc = dear_partition_set(p, nunits, ng, first);
out:
    free(first);
    return rc;
}

/* The plan's units, as (tensor, offset, bytes) triples; none when no tensor is cut. */
static int bcast_units(dear_ctx_t *ctx, dear_plan_t *plan)
{
    int rc = DEAR_OK, hdr[2] = { plan->nunits, plan->units != NULL };
    int64_t *w = NULL;
    DEAR_MPI_CHECK(MPI_Bcast(hdr, 2, MPI_INT, 0, ctx->cm.comm));
    plan->nunits = hdr[0];
    plan->ntensors = ctx->reg.ntensors;
    if (!hdr[1])
        return DEAR_OK;
    size_t n = (size_t)hdr[0];
    DEAR_ALLOC_GOTO(w, malloc(sizeof *w * 3 * n), sizeof *w * 3 * n, rc, out);
    for (size_t i = 0; ctx->cm.rank == 0 && i < n; i++) {
        w[3 * i] = plan->units[i].tensor;
        w[3 * i + 1] = (int64_t)plan->units[i].offset;
        w[3 * i + 2] = (int64_t)plan->units[i].bytes;
    }
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(w, (int)(3 * n), MPI_INT64_T, 0, ctx->cm.comm), rc, out);
    if (ctx->cm.rank != 0) {
        free(plan->units);
        DEAR_ALLOC_GOTO(plan->units, malloc(sizeof *plan->units * n), sizeof *plan->units * n, rc, out);
        for (size_t i = 0; i < n; i++)
            plan->units[i] = (dear_unit_t){ .tensor = (int)w[3 * i], .offset = (size_t)w[3 * i + 1],
                                            .bytes = (size_t)w[3 * i + 2] };
    }
out:
    free(w);
    return rc;
}

/* The plan fits the registered tensors: well formed, every cut inside its tensor, on an element
 * and, for a sparse tensor, on a row. */
static int plan_fits(dear_ctx_t *ctx, const dear_plan_t *plan)
{
    int rc = DEAR_OK;
    char msg[256];
    dear_tensor_desc_t *desc = NULL;
    const char **names = NULL;
    if (dear_plan_validate(plan, ctx->reg.ntensors, msg, sizeof msg) != DEAR_OK) {
        DEAR_ERROR("plan", "the plan is malformed: %s", msg);
        return DEAR_ERR_INTERNAL;
    }
    DEAR_CHECK(dear_tensor_table(ctx, &desc, &names));
    if (dear_units_check(ctx->reg.ntensors, desc, plan->nunits, plan->units, msg, sizeof msg) != DEAR_OK) {
        DEAR_ERROR("plan", "the plan's units do not fit the registered tensors: %s", msg);
        rc = DEAR_ERR_INTERNAL;
    }
    free(desc);
    free(names);
    return rc;
}

/* MPI_Bcast of rank 0's verdict, which the other ranks wait for while rank 0 plans: they sleep
 * between tests (50 us growing to 1 ms) rather than spin in MPI, whose polling on a host with
 * more ranks than cores takes the core rank 0 plans on. */
static int bcast_verdict(dear_ctx_t *ctx, int *rc)
{
    MPI_Request req;
    int done = 0;
    double nap = 50e-6;
    DEAR_MPI_CHECK(MPI_Ibcast(rc, 1, MPI_INT, 0, ctx->cm.comm, &req));
    for (;;) {
        DEAR_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done)
            return DEAR_OK;
        dear_sleep(nap);
        nap = nap < 1e-3 ? 2 * nap : 1e-3;
    }
}

/* DEAR_DEBUG_EARLY=alternate (tests only): rank 0 marks every other all-gather group early from
 * the first before the broadcast, so every rank builds the same order. */
static int debug_early(dear_plan_t *plan)
{
    int ng = plan->ag.ngroups;
    if (dear_param_enum(DEAR_P_DEBUG_EARLY) == 0 || ng < 2)
        return DEAR_OK;
    unsigned char *mark = malloc((size_t)ng);
    if (!mark)
        return DEAR_ERR_NOMEM;
    for (int g = 0; g < ng; g++)
        mark[g] = g % 2 == 0;
    int rc = dear_plan_set_early(plan, mark);
    free(mark);
    return rc;
}

int dear_planning_bcast(dear_ctx_t *ctx, dear_plan_t *plan, int rc0)
{
    int rc = rc0;
    DEAR_CHECK(bcast_verdict(ctx, &rc));
    if (rc != DEAR_OK) {
        if (ctx->cm.rank != 0 && rc == DEAR_ERR_MISMATCH)
            DEAR_ERROR("plan", "rank 0 could not make a plan: its DEAR_PLAN_FILE does not fit the registered "
                               "tensors; see its message");
        else if (ctx->cm.rank != 0)
            DEAR_ERROR("plan", "rank 0 could not make a plan (%s); see its message", dear_status_string(rc));
        return rc;
    }
    DEAR_MPI_CHECK(MPI_Bcast(plan->planner, (int)sizeof plan->planner, MPI_CHAR, 0, ctx->cm.comm));
    DEAR_CHECK(bcast_units(ctx, plan));
    DEAR_CHECK(bcast_partition(ctx, &plan->rs, plan->nunits));
    DEAR_CHECK(bcast_partition(ctx, &plan->ag, plan->nunits));
    /* The early groups: a count, and the marks where they are not a trailing run. A failed test
     * marking leaves the plan's: rank 0 must not leave the others waiting in the broadcast. */
    if (ctx->cm.rank == 0 && debug_early(plan) != DEAR_OK)
        DEAR_WARN("plan", "DEAR_DEBUG_EARLY: out of memory marking the plan's early groups; the plan's are kept");
    int early[2] = { plan->ag_early, plan->early != NULL };
    DEAR_MPI_CHECK(MPI_Bcast(early, 2, MPI_INT, 0, ctx->cm.comm));
    if (ctx->cm.rank != 0) {
        free(plan->early);
        plan->early = NULL;
        plan->ag_early = early[0];
        if (early[1])
            DEAR_ALLOC_CHECK(plan->early, malloc((size_t)plan->ag.ngroups + 1), (size_t)plan->ag.ngroups + 1);
    }
    if (early[1])
        DEAR_MPI_CHECK(MPI_Bcast(plan->early, plan->ag.ngroups, MPI_UNSIGNED_CHAR, 0, ctx->cm.comm));
    return plan_fits(ctx, plan);
}

int dear_planning_initial(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    if (ctx->cm.rank == 0)
        rc = make_plan(ctx, &ctx->graph.plan);
    return dear_planning_bcast(ctx, &ctx->graph.plan, rc);
}

/* ---- online planning ---- */

int dear_planning_setup(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    /* Rank 0's settings decide, as its plan does: ranks with different environments still agree
     * on whether and when to plan. */
    const char *fusion = dear_param_string(DEAR_P_FUSION);
    dear_planner_t planner = (dear_planner_t)dear_param_enum(DEAR_P_FUSION);
    const char *pfile = dear_param_string(DEAR_P_PLAN_FILE);
    int cfg[7];
    cfg[0] = (dear_planner_flags(planner) & DEAR_PLANNER_F_MODEL) && ctx->cfg.sched != DEAR_SCHED_SYNC &&
             !(pfile && pfile[0]) && ctx->cm.size > 1;
    cfg[1] = (int)dear_param_int(DEAR_P_WARMUP_ITERS);
    cfg[2] = (int)dear_param_int(DEAR_P_REPLAN_EVERY);
    cfg[3] = (int)dear_param_enum(DEAR_P_CALIBRATE); /* auto|off */
    /* Only auto promises the fastest plan it can find; a named planner's plan is kept. */
    cfg[4] = planner == DEAR_PLANNER_AUTO ? (int)dear_param_int(DEAR_P_VERIFY_ITERS) : 0;
    cfg[5] = (int)dear_param_enum(DEAR_P_FIRST_PLAN);
    cfg[6] = (int)dear_param_int(DEAR_P_VERIFY_TRIES);
    double margin = dear_param_double(DEAR_P_VERIFY_MARGIN);
    DEAR_MPI_CHECK(MPI_Bcast(cfg, 7, MPI_INT, 0, ctx->cm.comm));
    DEAR_MPI_CHECK(MPI_Bcast(&margin, 1, MPI_DOUBLE, 0, ctx->cm.comm));
    ctx->online.min_gain = dear_param_double(DEAR_P_REPLAN_MIN_GAIN); /* rank 0's: it alone plans */
    ctx->online.first_min_gain = dear_param_double(DEAR_P_FIRST_MIN_GAIN);
    ctx->online.refit = (int)dear_param_enum(DEAR_P_COST_REFIT);
    ctx->online.fit_scale = 1;
    ctx->online.enabled = cfg[0];
    ctx->online.replan_every = cfg[2];
    ctx->online.next_plan_iter = ctx->online.enabled ? cfg[1] : -1;
    ctx->online.first_plan = cfg[5];
    /* With one warm-up iteration the measured profile comes at the same backward_end. */
    ctx->online.rescale_at = ctx->online.enabled && cfg[5] == DEAR_FIRST_FIRST && cfg[1] > 1 ? 1 : -1;
    ctx->check.iters = ctx->online.enabled ? cfg[4] : 0;
    ctx->check.margin = margin;
    ctx->check.tries = cfg[6];
    ctx->check.at = -1;
    if (!ctx->online.enabled)
        return DEAR_OK;
    /* Here rather than at each check: a check is collective, and one rank short of memory there
     * would leave the others waiting in its reduction. */
    size_t vbytes = sizeof(double) * 2 * (size_t)ctx->check.iters;
    DEAR_ALLOC_GOTO(ctx->check.samples, calloc(1, vbytes), vbytes, rc, out);
    rc = dear_cost_setup(ctx, cfg[3] == 0);
    if (rc == DEAR_OK)
        DEAR_INFO("plan", "online planning: planner %s after %d warm-up iteration(s)%s", fusion, cfg[1],
                  cfg[2] > 0 ? ", then again periodically (DEAR_REPLAN_EVERY)" : "");
out:
    return rc;
}

static double predict(const dear_plan_problem_t *prob, const dear_plan_t *plan)
{
    dear_sim_result_t r = { 0 };
    if (dear_sim_run_ex(prob->prof, &prob->cost, prob->sched, plan, prob->shard, 0, &r) != DEAR_OK)
        return INFINITY;
    return r.iter_s;
}

/* Rank 0: auto's runners-up and tied plan of the last re-plan dropped. */
static void runners_free(dear_ctx_t *ctx)
{
    for (int k = 0; k < ctx->check.nrunners; k++)
        dear_plan_free(&ctx->check.runners[k]);
    ctx->check.nrunners = ctx->check.next_runner = 0;
    dear_plan_free(&ctx->check.tie);
}

void dear_planning_free(dear_ctx_t *ctx)
{
    runners_free(ctx);
    dear_samples_free(&ctx->online.in_force);
    dear_plan_free(&ctx->check.alt_plan);
}

/* Fitting the model to training (DEAR_COST_REFIT): fewer timed iterations of the plan in force
 * are too few for a median; beyond FIT_MAX_SCALE the calibration is wrong, not just optimistic,
 * and a larger factor would let one plan's noise reprice every plan. No tolerance: a plan in force
 * missed by less than a few iterations' noise still left the plan replacing it priced too fast
 * (docs/PERFORMANCE.md), and a fit to noise errs only dearer. */
#define FIT_MIN_ITERS 3
#define FIT_MAX_SCALE 2.0

/* Collective: the plan in force's measured iteration, the mean over the ranks of each one's
 * median since it went in force; 0 when a rank timed fewer than FIT_MIN_ITERS. */
static int in_force_measured(dear_ctx_t *ctx, double *measured_s)
{
    const dear_samples_t *v = &ctx->online.in_force;
    int enough = v->n >= FIT_MIN_ITERS;
    double mine[2] = { enough ? dear_samples_median(v) : 0, enough }, all[2];
    DEAR_MPI_CHECK(MPI_Allreduce(mine, all, 2, MPI_DOUBLE, MPI_SUM, ctx->cm.comm));
    *measured_s = all[1] == ctx->cm.size ? all[0] / ctx->cm.size : 0;
    return DEAR_OK;
}

/* Rank 0: *out (allocated) gets the model the planners use: the calibrated one, made dearer under
 * DEAR_COST_REFIT=plan by the factor at which the simulator prices the plan in force at measured_s.
 * The factor is found unless DEAR_COST_REFIT=off or nothing was measured (measured_s 0), and is
 * above 1 when the calibrated model prices the plan faster; ctx->online.fit_* record it. A fit
 * that fails keeps the calibrated model (logged). */
static int fit_model(dear_ctx_t *ctx, const dear_profile_t *prof, double measured_s, dear_cost_model_t **out)
{
    dear_cost_model_t *m = malloc(sizeof *m);
    if (!m)
        return DEAR_ERR_NOMEM;
    *m = ctx->online.cost;
    *out = m;
    ctx->online.fit_scale = 1, ctx->online.fit_measured_s = ctx->online.fit_pred_s = 0;
    if (ctx->online.refit == DEAR_REFIT_OFF || !(measured_s > 0))
        return DEAR_OK;
    dear_plan_problem_t prob;
    dear_sim_model_arg_t marg;
    double s = 1, pred = INFINITY;
    int rc = dear_plan_problem_init(&prob, prof, ctx->cfg.sched, m, 0, &marg);
    if (rc == DEAR_OK) {
        context_problem(ctx, &prob);
        pred = predict(&prob, &ctx->graph.plan);
    }
    if (rc == DEAR_OK && !isfinite(pred)) {
        /* a collective the model has no price for: nothing to scale */
        DEAR_INFO("plan", "cost model not fitted to training: it prices plan %s at no finite time",
                  ctx->graph.plan.planner);
        return DEAR_OK;
    }
    if (rc == DEAR_OK && measured_s > pred)
        rc = dear_sim_fit_scale(prof, &prob.cost, prob.sched, &ctx->graph.plan, prob.shard, measured_s,
                                FIT_MAX_SCALE, &s);
    if (rc != DEAR_OK) {
        DEAR_WARN("plan", "fitting the cost model to training failed (%s); planning with the calibrated model",
                  dear_status_string(rc));
        return DEAR_OK;
    }
    ctx->online.fit_scale = s;
    ctx->online.fit_measured_s = measured_s;
    ctx->online.fit_pred_s = pred;
    int plan = ctx->online.refit == DEAR_REFIT_PLAN;
    if (s > 1 && plan)
        dear_cost_mul(m, s);
    DEAR_INFO("plan", "cost model fitted to training at iteration %lld: plan %s ran %.3f ms per iteration (each "
                      "rank's median over the iterations since it went in force, the mean over the ranks), the "
                      "calibrated model prices it at %.3f ms: collectives %.3fx dearer%s; %s (DEAR_COST_REFIT)",
              ctx->it.iter, ctx->graph.plan.planner, 1e3 * measured_s, 1e3 * pred, s,
              s >= FIT_MAX_SCALE ? ", the most it fits" : s > 1 ? "" : " (it ran as priced or faster)",
              plan ? "the planners use the fitted model" : "a forecast only, the planners keep the calibrated model");
    return DEAR_OK;
}

/* Rank 0: plan with planner `which` from a profile of the tensors (the medians, or the first
 * iteration's estimate); logs the choice (what: which plan this is) against the threshold plan.
 * pred: the predicted iteration time of the plan in force [0], the new one [1] and the threshold
 * plan [2], for auto's check; thr_out (when not NULL) gets that threshold plan. All range over
 * the units of the plan in force, so they are priced alike. */
static int plan_rank0(dear_ctx_t *ctx, const dear_profile_t *tprof, dear_planner_t which, double measured_s,
                      dear_plan_t *plan, double pred[3], dear_plan_t *thr_out, const char *what)
{
    int rc;
    dear_cost_model_t *model = NULL;
    dear_plan_problem_t prob;
    dear_sim_model_arg_t marg;
    dear_plan_t thr = { 0 };
    dear_profile_t uprof = { 0 }, *prof = &uprof;
    const char *fusion = dear_param_string(DEAR_P_FUSION);
    double t0 = dear_now();

    rc = dear_prof_units(tprof, ctx->graph.plan.nunits, ctx->graph.plan.units, &uprof);
    if (rc == DEAR_OK)
        rc = fit_model(ctx, prof, measured_s, &model);
    if (rc == DEAR_OK)
        rc = dear_plan_problem_init(&prob, prof, ctx->cfg.sched, model, 0, &marg);
    if (rc == DEAR_OK) {
        prob.threshold = (size_t)dear_param_int(DEAR_P_FUSION_THRESHOLD);
        prob.seed = (uint64_t)dear_param_int(DEAR_P_SEED);
        context_problem(ctx, &prob);
        runners_free(ctx);
        /* auto's check may go on to the runners-up when the plan loses, or to the tied plan when
         * it stays (DEAR_VERIFY_TRIES). */
        if (which == DEAR_PLANNER_AUTO && ctx->check.iters > 0 && ctx->check.tries > 1)
            rc = dear_plan_auto_runners(plan, &prob, ctx->check.runners, ctx->check.runner_pred,
                                        ctx->check.tries - 1, &ctx->check.nrunners, &ctx->check.tie,
                                        &ctx->check.tie_pred);
        else
            rc = dear_plan_by_id(plan, &prob, which);
        if (rc == DEAR_OK)
            rc = dear_plan_set_units(plan, ctx->reg.ntensors, ctx->graph.plan.units);
        for (int k = 0; rc == DEAR_OK && k < ctx->check.nrunners; k++)
            rc = dear_plan_set_units(&ctx->check.runners[k], ctx->reg.ntensors, ctx->graph.plan.units);
        if (rc == DEAR_OK && ctx->check.tie.nunits > 0)
            rc = dear_plan_set_units(&ctx->check.tie, ctx->reg.ntensors, ctx->graph.plan.units);
        if (rc != DEAR_OK)
            DEAR_ERROR("plan", "%s: planner %s failed for %d tensors in %d units: %s", what, fusion,
                       ctx->reg.ntensors, ctx->graph.plan.nunits, dear_status_string(rc));
    }
    if (rc == DEAR_OK) {
        pred[0] = predict(&prob, &ctx->graph.plan);
        pred[1] = predict(&prob, plan);
        pred[2] = INFINITY;
    }
    if (rc == DEAR_OK && (thr_out || DEAR_LOG_ON(DEAR_LOG_INFO))) {
        int trc = dear_plan_by_id(&thr, &prob, DEAR_PLANNER_THRESHOLD);
        if (trc == DEAR_OK)
            trc = dear_plan_set_units(&thr, ctx->reg.ntensors, ctx->graph.plan.units);
        if (trc == DEAR_OK)
            pred[2] = predict(&prob, &thr);
        if (thr_out && trc == DEAR_OK) {
            snprintf(thr.planner, sizeof thr.planner, "threshold");
            rc = dear_plan_copy(thr_out, &thr);
        } else if (thr_out) {
            rc = trc;
        }
    }
    if (rc == DEAR_OK && DEAR_LOG_ON(DEAR_LOG_INFO)) {
        double tnew = pred[1], tcur = pred[0], tthr = pred[2];
        DEAR_INFO("plan", "%s at iteration %lld (%s, schedule %s): %s with %d reduce-scatter bucket(s) "
                          "and %d all-gather group(s); predicted iteration %.3f ms vs %.3f ms with threshold "
                          "(%zu B) and %.3f ms with the current plan (%s, %d bucket(s)); compute %.3f ms; planned "
                          "in %.1f ms",
                  what, ctx->it.iter, fusion, dear_sched_name(ctx->cfg.sched), plan->planner, plan->rs.ngroups, plan->ag.ngroups,
                  1e3 * tnew, 1e3 * tthr, prob.threshold, 1e3 * tcur, ctx->graph.plan.planner, ctx->graph.plan.rs.ngroups,
                  1e3 * (dear_prof_fwd_total(prof) + dear_prof_bwd_total(prof)), 1e3 * (dear_now() - t0));
    }
    dear_plan_free(&thr);
    dear_prof_free(&uprof);
    free(model);
    return rc;
}

/* After a plan switch or check (the progress thread stopped): a failure stops the context
 * (later hooks say so); otherwise the progress thread restarts with the operation order of the
 * plan in place, from this iteration on every rank. */
int dear_planning_restart(dear_ctx_t *ctx, int rc)
{
    if (rc != DEAR_OK) {
        ctx->eng.sh.rc = rc;
        ctx->online.next_plan_iter = -1;
        ctx->check.at = -1;
    }
    if (ctx->graph.nops > 0) {
        ctx->eng.pt.next_seq = ctx->eng.pt.next_prep = ctx->it.iter * ctx->graph.nops;
        int src = dear_engine_start(ctx);
        if (src != DEAR_OK && rc == DEAR_OK)
            rc = ctx->eng.sh.rc = src;
    }
    return rc;
}

/* ---- auto's check ----
 *
 * Rule: after a switch, the new plan and the one it replaced each run DEAR_VERIFY_ITERS timed
 * iterations, in blocks new (half), old (all), new (the other half), the first iteration after
 * each switch left out (the switch drained the pipeline). An iteration counts as the mean of
 * the ranks' times for it: in the steady state every rank runs at the common period, and the
 * slowest rank's time is biased up wherever the ranks' iteration boundaries jitter apart (plans
 * of many small collectives more than coarse ones). The plan whose median is lower by more than
 * the margin stays: margin = max(DEAR_VERIFY_MARGIN x spread, VERIFY_TOLERANCE x the lower
 * median), spread being the scaled median absolute deviation of both plans' iterations
 * (dear_samples_compare). Within the margin the measurement cannot tell them apart, and the
 * plan the model predicts faster stays, unless the difference the model predicted lies beyond
 * the margin from the measured one: samples that refute the model leave it no say, and the plan
 * measured faster stays (dear_check_verdict).
 * Why: a shared machine's noise between runs can exceed the difference being judged; the same
 * count of steady-state iterations for each plan, interleaved so a drift of the machine falls on
 * both, compares like with like, and a decision made only beyond the spread the samples
 * themselves show does not follow noise (docs/PERFORMANCE.md#verify). A re-plan due during the
 * check waits for its end; each later re-plan (DEAR_REPLAN_EVERY) that proposes another plan is
 * checked again, so a plan dropped on an unlucky measurement gets another chance. */

/* Differences under this share of an iteration never override the model: too small to be worth
 * a switch, and below what a few iterations of a shared machine can resolve. */
#define VERIFY_TOLERANCE DEAR_AUTO_TIE

/* Timed iterations of check block b (0 and 2: the new plan's halves, 1: the old plan). */
static int block_len(int n, int b)
{
    return b == 1 ? n : b == 0 ? (n + 1) / 2 : n / 2;
}

static void block_begin(dear_ctx_t *ctx, int b)
{
    ctx->check.block = b;
    ctx->check.len = block_len(ctx->check.iters, b);
    ctx->check.at = ctx->it.iter + 1 + ctx->check.len;
}

/* The other plan of the check into force; the one it replaces waits in alt_plan. */
static int swap_plan(dear_ctx_t *ctx)
{
    dear_plan_t cur = { 0 };
    int rc = dear_plan_copy(&cur, &ctx->graph.plan);
    if (rc == DEAR_OK)
        rc = dear_graph_rebuild(ctx, &ctx->check.alt_plan);
    if (rc == DEAR_OK) {
        dear_plan_free(&ctx->check.alt_plan);
        ctx->check.alt_plan = cur;
        return DEAR_OK;
    }
    dear_plan_free(&cur);
    return rc;
}

void dear_planning_sample(dear_ctx_t *ctx, double iter_s, double plan_s)
{
    /* The first iteration on a new graph drained the old one's pipeline: not the plan's time. */
    if (ctx->online.in_force_gen != ctx->graph.gen) {
        ctx->online.in_force_gen = ctx->graph.gen;
        ctx->online.in_force.n = 0;
    } else if (plan_s > 0) {
        dear_samples_add(&ctx->online.in_force, plan_s);
    }
    int n = ctx->check.iters, b = ctx->check.block;
    long long from = ctx->check.at - ctx->check.len; /* the settling iteration */
    if (ctx->check.at < 0 || ctx->it.iter <= from || ctx->it.iter > ctx->check.at)
        return;
    /* By position, not by count: every rank fills the same slots, and a slot no rank timed stays 0. */
    int pos = (int)(ctx->it.iter - from - 1) + (b == 2 ? block_len(n, 0) : 0);
    ctx->check.samples[(b == 1 ? 0 : n) + pos] = iter_s;
}

/* The timed iterations of one plan without the empty slots; returns their count. */
static size_t timed(double *v, int n)
{
    size_t k = 0;
    for (int i = 0; i < n; i++)
        if (v[i] > 0)
            v[k++] = v[i];
    return k;
}

/* The verdict every rank follows: rank 0 judges the iterations (mean over the ranks) and broadcasts.
 * v: keep the new plan (1) or the old (0); why (dear_verdict_t);
 * median old, median new, spread, margin, predicted old, predicted new (seconds). */
static int judge(dear_ctx_t *ctx, double v[8])
{
    int n = ctx->check.iters;
    double *s = ctx->check.samples;
    if (ctx->cm.rank == 0)
        DEAR_MPI_CHECK(MPI_Reduce(MPI_IN_PLACE, s, 2 * n, MPI_DOUBLE, MPI_SUM, 0, ctx->cm.comm));
    else
        DEAR_MPI_CHECK(MPI_Reduce(s, NULL, 2 * n, MPI_DOUBLE, MPI_SUM, 0, ctx->cm.comm));
    if (ctx->cm.rank == 0) {
        for (int i = 0; i < 2 * n; i++)
            s[i] /= ctx->cm.size; /* every rank times the same slots (dear_planning_sample) */
        size_t na = timed(s, n), nb = timed(s + n, n);
        dear_compare_t c = { NAN, NAN, NAN, NAN };
        int how = na && nb ? dear_samples_compare(s, na, s + n, nb, ctx->check.margin, VERIFY_TOLERANCE, &c)
                           : 0;
        dear_verdict_t why = DEAR_VERDICT_MODEL;
        /* the model does not tell tied plans apart: the samples alone decide */
        v[0] = ctx->check.in_tie ? dear_tie_verdict(how, &c, &why)
                                 : dear_check_verdict(how, &c, ctx->check.pred_s[0], ctx->check.pred_s[1], &why);
        v[1] = why;
        v[2] = c.med_a, v[3] = c.med_b, v[4] = c.spread, v[5] = c.margin;
        v[6] = ctx->check.pred_s[0], v[7] = ctx->check.pred_s[1];
    }
    DEAR_MPI_CHECK(MPI_Bcast(v, 8, MPI_DOUBLE, 0, ctx->cm.comm));
    return DEAR_OK;
}

/* The check begins on the new plan, just switched to; old waits in alt_plan (taken over). */
static void check_begin(dear_ctx_t *ctx, dear_plan_t *old, const double pred[2])
{
    dear_plan_free(&ctx->check.alt_plan);
    ctx->check.alt_plan = *old;
    *old = (dear_plan_t){ 0 };
    memset(ctx->check.samples, 0, sizeof(double) * 2 * (size_t)ctx->check.iters);
    ctx->check.pred_s[0] = pred[0];
    ctx->check.pred_s[1] = pred[1];
    ctx->check.tried++;
    ctx->check.in_tie = 0;
    block_begin(ctx, 0);
}

/* Rank 0: the registered model's structure with the compute of the first iteration (fwd_s, bwd_s)
 * spread over its layers by their costs. */
static int first_times_profile(const dear_ctx_t *ctx, double fwd_s, double bwd_s, dear_profile_t *prof)
{
    dear_profile_t st = { 0 };
    int rc = dear_profile_structure(ctx, &st);
    if (rc == DEAR_OK)
        rc = dear_prof_estimate(&st, fwd_s, bwd_s, prof);
    dear_prof_free(&st);
    return rc;
}

/* A re-plan at a backward_end with nothing in flight: from the measured profile (followed by
 * auto's check), or (rescale) from the structure with the first iteration's times. */
static int replan(dear_ctx_t *ctx, int rescale)
{
    dear_plan_t plan = { 0 }, thr = { 0 };
    dear_profile_t prof = { 0 };
    double pred[3] = { 0, 0, 0 };
    int rc;
    /* The first online plan after a plan made without a profile: that plan was never measured,
     * so auto's check measures the online plan (kept or new) against the threshold plan, as it
     * does when training starts on the threshold plan. Why: the estimate rests on the cost model
     * alone, and a cost model wrong for this machine must not leave a plan slower than the
     * threshold plan in force unmeasured. Every rank derives the same flag. */
    int guard = !rescale && ctx->check.iters > 0 && ctx->online.first_plan != DEAR_FIRST_THRESHOLD &&
                ctx->online.nplans == 0;

    /* The caller drained the old plan's collectives: with the thread stopped, the communicator
     * is this thread's alone and the operations can be rebuilt. */
    dear_engine_stop(ctx);
    ctx->eng.sh.stop = 0;
    if (!rescale)
        ctx->check.tried = 0;
    int keep = 0; /* rank 0: nothing measured to scale the estimate by */
    int margin_thr = 0; /* rank 0: DEAR_FIRST_MIN_GAIN sent the plan made again to the threshold plan */
    double measured_s = 0; /* the plan in force's iteration (mean over the ranks), 0: not measured */
    if (rescale) {
        double fwd_s = 0, bwd_s = 0;
        rc = dear_first_iteration_times(ctx, &fwd_s, &bwd_s);
        keep = !(fwd_s + bwd_s > 0);
        if (rc == DEAR_OK && ctx->cm.rank == 0 && !keep)
            rc = first_times_profile(ctx, fwd_s, bwd_s, &prof);
    } else {
        rc = in_force_measured(ctx, &measured_s);
        if (rc == DEAR_OK)
            rc = dear_profile_measured(ctx, "online", 1, &prof);
    }
    if (rc == DEAR_ERR_MPI)
        goto out;
    dear_planner_t which = (dear_planner_t)dear_param_enum(DEAR_P_FUSION);
    if (ctx->cm.rank == 0 && rc == DEAR_OK && keep)
        rc = dear_plan_copy(&plan, &ctx->graph.plan);
    else if (ctx->cm.rank == 0 && rc == DEAR_OK)
        rc = plan_rank0(ctx, &prof, rescale ? dear_estimate_planner(which) : which, measured_s, &plan, pred,
                        guard || rescale ? &thr : NULL,
                        rescale ? "first plan, with the first iteration's times" : "online plan");
    if (ctx->cm.rank == 0 && rc == DEAR_OK && rescale && !keep) {
        char name[sizeof plan.planner];
        snprintf(name, sizeof name, "est:%.27s", plan.planner); /* made from an estimate */
        snprintf(plan.planner, sizeof plan.planner, "%s", name);
        /* Still an estimate (of the spread of compute): as at commit, DEAR_FIRST_MIN_GAIN over the
         * threshold plan or the threshold plan, whatever the plan in force. */
        if (dear_first_start_decide(pred[1], pred[2], ctx->online.first_min_gain, dear_plan_equal(&plan, &thr))
                .threshold) {
            margin_thr = 1;
            DEAR_INFO("plan", "first plan at iteration %lld: %s predicted %.3f ms against %.3f ms for the threshold "
                              "plan, a gain under DEAR_FIRST_MIN_GAIN=%g: the threshold plan instead",
                      ctx->it.iter, plan.planner, 1e3 * pred[1], 1e3 * pred[2], ctx->online.first_min_gain);
            rc = dear_plan_copy(&plan, &thr);
            pred[1] = pred[2];
            snprintf(plan.planner, sizeof plan.planner, "threshold(warm-up)");
        }
    }
    if (ctx->cm.rank == 0 && rc == DEAR_OK && !keep && !margin_thr && pred[1] > pred[0] * (1 - ctx->online.min_gain) &&
        !dear_plan_equal(&plan, &ctx->graph.plan)) {
        /* A switch drains the pipeline (and under auto sets off the check): a small gain does not
         * repay it. */
        DEAR_INFO("plan", "%s at iteration %lld: keeping %s, predicted %.3f ms against %.3f ms for %s "
                          "(a gain under %g%%, DEAR_REPLAN_MIN_GAIN, does not repay a switch)",
                  rescale ? "first plan" : "online plan", ctx->it.iter, ctx->graph.plan.planner, 1e3 * pred[0],
                  1e3 * pred[1], plan.planner, 100 * ctx->online.min_gain);
        rc = dear_plan_copy(&plan, &ctx->graph.plan);
    }
    /* Switch only after this; a planner failure keeps the plan that works (communication
     * errors stop the context as usual). */
    if (!rescale)
        ctx->online.next_plan_iter = ctx->online.replan_every > 0 ? ctx->it.iter + ctx->online.replan_every : -1;
    /* Rank 0's fit, every rank's to report (dear_get_plan_info). */
    double fit[3] = { ctx->online.fit_scale, ctx->online.fit_measured_s, ctx->online.fit_pred_s };
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(fit, 3, MPI_DOUBLE, 0, ctx->cm.comm), rc, out);
    ctx->online.fit_scale = fit[0], ctx->online.fit_measured_s = fit[1], ctx->online.fit_pred_s = fit[2];
    rc = dear_planning_bcast(ctx, &plan, rc);
    if (guard && rc == DEAR_OK)
        rc = dear_planning_bcast(ctx, &thr, rc);
    if (rc == DEAR_ERR_MPI || rc == DEAR_ERR_NOMEM)
        goto out;
    if (rc != DEAR_OK) {
        DEAR_WARN("plan", "%s at iteration %lld failed (%s); keeping plan %s",
                  rescale ? "re-planning the first plan" : "online planning", ctx->it.iter, dear_status_string(rc),
                  ctx->graph.plan.planner);
        rc = DEAR_OK;
        goto out;
    }
    if (guard && !dear_plan_equal(&plan, &thr)) {
        /* The check's old plan is the threshold plan, whichever plan is in force now. */
        if (!dear_plan_equal(&plan, &ctx->graph.plan))
            DEAR_CHECK_GOTO(dear_graph_rebuild(ctx, &plan), rc, out);
        else
            snprintf(ctx->graph.plan.planner, sizeof ctx->graph.plan.planner, "%s", plan.planner);
        pred[0] = pred[2];
        DEAR_INFO("plan", "online plan at iteration %lld: %s measured against the threshold plan (%d bucket(s)): "
                          "the plan before it was made without a profile",
                  ctx->it.iter, ctx->graph.plan.planner, thr.rs.ngroups);
        check_begin(ctx, &thr, pred);
    } else if (!dear_plan_equal(&plan, &ctx->graph.plan)) {
        /* Keep the plan being replaced for auto's check, which judges the measured profile's plans. */
        dear_plan_t prev = { 0 };
        DEAR_CHECK_GOTO(dear_plan_copy(&prev, &ctx->graph.plan), rc, out);
        DEAR_CHECK_GOTO(dear_graph_rebuild(ctx, &plan), rc, out_prev);
        /* guard here: the online plan is the threshold plan, which a threshold start would have
         * switched to unchecked. */
        if (ctx->check.iters > 0 && !rescale && !guard)
            check_begin(ctx, &prev, pred);
out_prev:
        dear_plan_free(&prev);
        if (rc != DEAR_OK)
            goto out;
    } else {
        /* Same buckets: keep them, but record who confirmed them. */
        snprintf(ctx->graph.plan.planner, sizeof ctx->graph.plan.planner, "%s", plan.planner);
        DEAR_INFO("plan", "%s at iteration %lld: unchanged (%d bucket(s))", rescale ? "first plan" : "online plan",
                  ctx->it.iter, ctx->graph.nbuckets);
    }
    if (!rescale)
        ctx->online.nplans++;
out:
    rc = dear_planning_restart(ctx, rc);
    dear_plan_free(&plan);
    dear_plan_free(&thr);
    dear_prof_free(&prof);
    return rc;
}

int dear_planning_replan(dear_ctx_t *ctx)
{
    return replan(ctx, 0);
}

int dear_planning_rescale(dear_ctx_t *ctx)
{
    ctx->online.rescale_at = -1;
    return replan(ctx, 1);
}

/* After a check the new plan lost (the plan it replaced in force again): rank 0's next runner-up
 * unlike the plan in force, if any is left, is switched to and checked against it the same way.
 * pred_old: the plan in force's predicted iteration (rank 0's). Why: the model mispriced the plan
 * it ranked first, and the plan in force is often the threshold plan kept from the warm-up; the
 * next plan in the ranking, or the same buckets halved, may still beat it (the log names each).
 * tie: instead, auto's plan stayed after its first check, and the plan tied with it (if any) is
 * checked against it; the check ends there, whichever stays. */
static int try_runner_up(dear_ctx_t *ctx, double pred_old, int tie)
{
    int rc = DEAR_OK, have = 0;
    dear_plan_t next = { 0 }, old = { 0 };
    double pred[2] = { pred_old, 0 };
    if (ctx->cm.rank == 0 && tie && ctx->check.tie.nunits > 0 && !dear_plan_equal(&ctx->check.tie, &ctx->graph.plan)) {
        rc = dear_plan_copy(&next, &ctx->check.tie);
        pred[1] = ctx->check.tie_pred;
        have = rc == DEAR_OK;
    }
    while (ctx->cm.rank == 0 && !tie && !have && ctx->check.next_runner < ctx->check.nrunners) {
        int k = ctx->check.next_runner++;
        if (dear_plan_equal(&ctx->check.runners[k], &ctx->graph.plan))
            continue;
        rc = dear_plan_copy(&next, &ctx->check.runners[k]);
        pred[1] = ctx->check.runner_pred[k];
        have = rc == DEAR_OK;
    }
    if (ctx->cm.rank == 0 && rc != DEAR_OK) /* out of memory for a copy: the plan in force stays */
        DEAR_WARN("plan", "auto's check: cannot take the next %s (%s)", tie ? "tied plan" : "runner-up",
                  dear_status_string(rc));
    /* rank 0 alone chose and predicted the next plan: whether there is one, and its figure, which
     * every rank logs and keeps */
    double chosen[2] = { have, pred[1] };
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(chosen, 2, MPI_DOUBLE, 0, ctx->cm.comm), rc, out);
    have = chosen[0] != 0, pred[1] = chosen[1];
    rc = DEAR_OK;
    if (!have && tie)
        goto out;
    if (!have) {
        DEAR_INFO("plan", "auto's check: no runner-up left after %d plan(s) timed; keeping %s", ctx->check.tried,
                  ctx->graph.plan.planner);
        goto out;
    }
    DEAR_CHECK_GOTO(dear_planning_bcast(ctx, &next, DEAR_OK), rc, out);
    DEAR_INFO("plan", "auto's check: trying %s %s (%d reduce-scatter bucket(s), %d all-gather group(s)) against "
                      "%s, plan %d of at most %d (DEAR_VERIFY_TRIES); predicted %.3f ms against %.3f ms",
              tie ? "the plan tied with it," : "runner-up", next.planner, next.rs.ngroups, next.ag.ngroups,
              ctx->graph.plan.planner, ctx->check.tried + 1, ctx->check.tries, 1e3 * pred[1], 1e3 * pred[0]);
    DEAR_CHECK_GOTO(dear_plan_copy(&old, &ctx->graph.plan), rc, out);
    DEAR_CHECK_GOTO(dear_graph_rebuild(ctx, &next), rc, out);
    check_begin(ctx, &old, pred);
    ctx->check.in_tie = tie;
out:
    dear_plan_free(&next);
    dear_plan_free(&old);
    return rc;
}

int dear_planning_verify(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    dear_engine_stop(ctx);
    ctx->eng.sh.stop = 0;
    int b = ctx->check.block + 1;
    if (b == 2 && block_len(ctx->check.iters, 2) == 0)
        b = 3; /* one iteration each: no second half of the new plan */
    if (b <= 2) {
        DEAR_CHECK_GOTO(swap_plan(ctx), rc, out);
        block_begin(ctx, b);
        DEAR_DEBUG("plan", "auto's check: %s plan %s for %d iteration(s) after this one", b == 1 ? "old" : "new",
                   ctx->graph.plan.planner, ctx->check.len);
        goto out;
    }
    int new_in_force = ctx->check.block != 1;
    ctx->check.at = -1;
    double v[8];
    DEAR_CHECK_GOTO(judge(ctx, v), rc, out);
    int keep_new = v[0] != 0;
    dear_verdict_t verdict = (dear_verdict_t)v[1];
    const dear_plan_t *pnew = new_in_force ? &ctx->graph.plan : &ctx->check.alt_plan;
    const dear_plan_t *pold = new_in_force ? &ctx->check.alt_plan : &ctx->graph.plan;
    char why[256];
    if (verdict == DEAR_VERDICT_MEASURED)
        snprintf(why, sizeof why, "the %s plan measured faster beyond the margin", keep_new ? "new" : "old");
    else if (verdict == DEAR_VERDICT_MODEL)
        snprintf(why, sizeof why, "inconclusive, so the model decides: predicted %.3f ms (old) vs %.3f ms (new)",
                 1e3 * v[6], 1e3 * v[7]);
    else if (verdict == DEAR_VERDICT_TIE)
        snprintf(why, sizeof why, "inconclusive between plans the model predicts alike (%.3f ms (old) vs %.3f ms "
                 "(new)), so the plan of the lower median stays", 1e3 * v[6], 1e3 * v[7]);
    else
        snprintf(why, sizeof why,
                 "inconclusive, and the samples refute the model (predicted %.3f ms (old) vs %.3f ms (new), a "
                 "difference further than the margin from the measured one), so the plan measured faster stays",
                 1e3 * v[6], 1e3 * v[7]);
    DEAR_INFO("plan", "auto's check, %d iteration(s) per plan (mean over the ranks): plan %s median %.3f ms, plan %s (it "
                      "replaced) median %.3f ms, spread %.3f ms, margin %.3f ms (DEAR_VERIFY_MARGIN): %s; keeping %s",
              ctx->check.iters, pnew->planner, 1e3 * v[3], pold->planner, 1e3 * v[2], 1e3 * v[4], 1e3 * v[5],
              why, keep_new ? pnew->planner : pold->planner);
    if (keep_new != new_in_force)
        DEAR_CHECK_GOTO(swap_plan(ctx), rc, out);
    if (!keep_new)
        ctx->check.nreverts++;
    /* A lost plan goes on to the runners-up; auto's plan kept at its first check goes on to the
     * plan tied with it. A tied plan's check, kept or not, ends the chain. */
    int was_tie = ctx->check.in_tie;
    ctx->check.in_tie = 0;
    if (!was_tie && ctx->check.tried < ctx->check.tries && (!keep_new || ctx->check.tried == 1))
        DEAR_CHECK_GOTO(try_runner_up(ctx, keep_new ? v[7] : v[6], keep_new), rc, out);
    if (ctx->check.at < 0 && ctx->cm.rank == 0)
        runners_free(ctx);
    /* A re-plan that fell due during the check comes a full period after it. */
    if (ctx->online.next_plan_iter >= 0 && ctx->online.next_plan_iter <= ctx->it.iter)
        ctx->online.next_plan_iter = ctx->it.iter + ctx->online.replan_every;
out:
    rc = dear_planning_restart(ctx, rc);
    if (ctx->check.at < 0)
        dear_plan_free(&ctx->check.alt_plan);
    return rc;
}

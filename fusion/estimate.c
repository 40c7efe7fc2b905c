/* Estimated profiles from the model's structure, and planning across the unknown scale
 * (fusion/estimate.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/sched_table.h"
#include "fusion/estimate.h"
#include "fusion/planner_impl.h"
#include "include/dear_types.h"

int dear_estimate_costs(const dear_profile_t *prof, double *cost)
{
    if (!prof || !cost)
        return DEAR_ERR_ARG;
    int nl = prof->nlayers;
    double *bytes = calloc((size_t)(nl > 0 ? nl : 1), sizeof *bytes);
    if (!bytes)
        return DEAR_ERR_NOMEM;
    for (int t = 0; t < prof->ntensors; t++) {
        const dear_prof_tensor_t *pt = &prof->tensors[t];
        if (pt->block_bytes == 0 && pt->lidx >= 0 && pt->lidx < nl)
            bytes[pt->lidx] += (double)pt->bytes;
    }
    /* Unhinted layers do the hinted ones' work per byte of parameters: the units then agree. */
    double hinted = 0, hinted_bytes = 0;
    for (int l = 0; l < nl; l++)
        if (prof->layers[l].flops >= 0) {
            hinted += prof->layers[l].flops;
            hinted_bytes += bytes[l];
        }
    double per_byte = hinted_bytes > 0 && hinted > 0 ? hinted / hinted_bytes : 1.0;
    for (int l = 0; l < nl; l++)
        cost[l] = prof->layers[l].flops >= 0 ? prof->layers[l].flops : per_byte * bytes[l];
    free(bytes);
    return DEAR_OK;
}

/* A copy of prof (layers without hints, times set) into *out (replaced on success): layer l's
 * times are fwd_s and bwd_s x share[l], or, share NULL, its own times x f. */
static int copy_prof(const dear_profile_t *prof, const double *share, double fwd_s, double bwd_s, double f,
                     dear_profile_t *out)
{
    dear_profile_t p = { 0 };
    int rc = dear_prof_copy(prof, &p);
    if (rc != DEAR_OK)
        return rc;
    p.no_times = 0;
    for (int l = 0; l < p.nlayers; l++) {
        dear_prof_layer_t *L = &p.layers[l];
        L->fwd_s = share ? fwd_s * share[l] : f * L->fwd_s;
        L->bwd_s = share ? bwd_s * share[l] : f * L->bwd_s;
        L->flops = -1;
    }
    dear_prof_free(out);
    *out = p;
    return DEAR_OK;
}

int dear_prof_estimate(const dear_profile_t *prof, double fwd_s, double bwd_s, dear_profile_t *out)
{
    if (!prof || !out || !(fwd_s >= 0) || !(bwd_s >= 0) || !isfinite(fwd_s) || !isfinite(bwd_s))
        return DEAR_ERR_ARG;
    int nl = prof->nlayers;
    double *share = malloc(sizeof *share * (size_t)(nl > 0 ? nl : 1)), sum = 0;
    if (!share)
        return DEAR_ERR_NOMEM;
    int rc = dear_estimate_costs(prof, share);
    for (int l = 0; l < nl && rc == DEAR_OK; l++)
        sum += share[l];
    for (int l = 0; l < nl && rc == DEAR_OK; l++)
        share[l] = sum > 0 ? share[l] / sum : 1.0 / nl;
    if (rc == DEAR_OK)
        rc = copy_prof(prof, share, fwd_s, bwd_s, 1, out);
    free(share);
    return rc;
}

double dear_estimate_comm_s(const dear_plan_problem_t *prob, const dear_profile_t *prof)
{
    size_t bytes = dear_prof_bytes_total(prof);
    if (dear_sched_flags(prob->sched) & DEAR_SCHED_F_SPLIT)
        return prob->cost.fn(prob->cost.arg, DEAR_COLL_REDUCE_SCATTER, bytes) +
               prob->cost.fn(prob->cost.arg, DEAR_COLL_ALLGATHER, bytes);
    return prob->cost.fn(prob->cost.arg, DEAR_COLL_ALLREDUCE, bytes);
}

dear_planner_t dear_estimate_planner(dear_planner_t which)
{
    /* A search refines a plan for the profile it is given; an estimate is not worth its time. */
    return which == DEAR_PLANNER_AUTO || which == DEAR_PLANNER_GRADSSA ? DEAR_PLANNER_DP : which;
}

/* prof's times multiplied by f into *out (a copy). */
static int scaled(const dear_profile_t *prof, double f, dear_profile_t *out)
{
    return copy_prof(prof, NULL, 0, 0, f, out);
}

/* T(a) and T(b) on prob->prof with compute scaled to `ratio` times the time of communicating
 * every gradient once (as is, when ratio or either total is zero). */
static int predict_pair(const dear_plan_problem_t *prob, const dear_plan_t *a, const dear_plan_t *b, double ratio,
                        double *ta, double *tb)
{
    double comm = dear_estimate_comm_s(prob, prob->prof),
           comp = dear_prof_fwd_total(prob->prof) + dear_prof_bwd_total(prob->prof);
    dear_profile_t at = { 0 };
    int rc = ratio > 0 && comm > 0 && isfinite(comm) && comp > 0 ? scaled(prob->prof, ratio * comm / comp, &at)
                                                                : dear_prof_copy(prob->prof, &at);
    if (rc != DEAR_OK)
        return rc;
    dear_plan_problem_t p = *prob;
    p.prof = &at;
    *ta = dear_planner_predict(&p, a, &rc);
    *tb = rc == DEAR_OK ? dear_planner_predict(&p, b, &rc) : NAN;
    dear_prof_free(&at);
    return rc;
}

dear_first_start_t dear_first_start_decide(double plan_s, double thr_s, double min_gain, int same)
{
    dear_first_start_t d = { plan_s, thr_s, thr_s > 0 ? 1 - plan_s / thr_s : 0, min_gain, 0 };
    if (isnan(plan_s) || isnan(thr_s))
        d.gain = NAN;
    d.threshold = !(d.gain >= min_gain) && !same;
    return d;
}

int dear_first_start(const dear_plan_problem_t *prob, const dear_plan_t *plan, const dear_plan_t *thr, double ratio,
                     double min_gain, int same, dear_first_start_t *out)
{
    if (!prob || !prob->prof || !plan || !thr || !out || !(ratio >= 0) || !isfinite(ratio)) {
        DEAR_ERROR("plan", "the first plan's start needs a problem, the plan, the threshold plan and a ratio >= 0");
        return DEAR_ERR_ARG;
    }
    double tp, tt;
    int rc = predict_pair(prob, plan, thr, ratio, &tp, &tt);
    if (rc == DEAR_OK)
        *out = dear_first_start_decide(tp, tt, min_gain, same);
    return rc;
}

int dear_plan_robust(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_planner_t which,
                     const dear_robust_range_t *range, double *regret)
{
    int rc = dear_planner_check(prob);
    if (rc != DEAR_OK)
        return rc;
    if (!range || range->npoints < 1 || !(range->lo > 0) || !(range->hi >= range->lo) || !isfinite(range->hi)) {
        DEAR_ERROR("plan", "planning across the unknown scale needs a range 0 < lo <= hi and at least one point");
        return DEAR_ERR_ARG;
    }
    which = dear_estimate_planner(which);
    int n = range->npoints, mid = n / 2;
    double comm = dear_estimate_comm_s(prob, prob->prof), comp = dear_prof_fwd_total(prob->prof) +
                                                                 dear_prof_bwd_total(prob->prof);
    dear_profile_t *prof = calloc((size_t)n, sizeof *prof);
    dear_plan_t *cand = calloc((size_t)n, sizeof *cand);
    double *t = calloc((size_t)n * (size_t)n, sizeof *t), *best = calloc((size_t)n, sizeof *best);
    if (!prof || !cand || !t || !best) {
        rc = DEAR_ERR_NOMEM;
        goto out;
    }
    if (!(comm > 0) || !isfinite(comm) || !(comp > 0)) {
        /* Nothing to trade: communication free or unpriced, or no compute to overlap with. */
        rc = dear_plan_by_id(plan, prob, which);
        if (rc == DEAR_OK && regret)
            *regret = 1;
        goto out;
    }
    /* Candidate i: the planner's plan for ratio i; t[i * n + j]: its iteration at ratio j. */
    for (int i = 0; i < n && rc == DEAR_OK; i++) {
        double r = n == 1 ? sqrt(range->lo * range->hi) : range->lo * pow(range->hi / range->lo, (double)i / (n - 1));
        rc = scaled(prob->prof, r * comm / comp, &prof[i]);
        if (rc == DEAR_OK) {
            dear_plan_problem_t p = *prob;
            p.prof = &prof[i];
            /* Off the middle, dp without its search for the split of the all-gathers (all in the
             * next forward): that search is most of dp's time on a large model, and these points
             * only guard against a scale far from the middle. */
            if (which == DEAR_PLANNER_DP && i != mid && prob->sched == DEAR_SCHED_DEAR)
                rc = dear_plan_dp_split(&cand[i], &p, prof[i].ntensors);
            else
                rc = dear_plan_by_id(&cand[i], &p, which);
        }
    }
    for (int i = 0; i < n && rc == DEAR_OK; i++)
        for (int j = 0; j < n && rc == DEAR_OK; j++) {
            int same = -1;
            for (int k = 0; k < i && same < 0; k++)
                if (dear_plan_equal(&cand[k], &cand[i]) && cand[k].ag_early == cand[i].ag_early)
                    same = k;
            if (same >= 0) {
                t[i * n + j] = t[same * n + j];
                continue;
            }
            dear_plan_problem_t p = *prob;
            p.prof = &prof[j];
            t[i * n + j] = dear_planner_predict(&p, &cand[i], &rc);
        }
    for (int j = 0; j < n && rc == DEAR_OK; j++) {
        best[j] = INFINITY;
        for (int i = 0; i < n; i++)
            best[j] = fmin(best[j], t[i * n + j]);
    }
    for (int i = 0; i < n && rc == DEAR_OK && DEAR_LOG_ON(DEAR_LOG_DEBUG); i++) {
        char row[256];
        int len = 0;
        for (int j = 0; j < n && len < (int)sizeof row - 32; j++)
            len += snprintf(row + len, sizeof row - (size_t)len, " %.3f", t[i * n + j] / best[j]);
        DEAR_DEBUG("plan", "planning across the scale: candidate %d (%s, %d bucket(s), %d group(s)), its iteration over "
                           "the best at each ratio:%s",
                   i, cand[i].planner, cand[i].rs.ngroups, cand[i].ag.ngroups, row);
    }
    /* The middle point's plan first: it wins ties. */
    int pick = -1;
    double worst_pick = INFINITY;
    for (int k = 0; k < n && rc == DEAR_OK; k++) {
        int i = k == 0 ? mid : k <= mid ? k - 1 : k;
        double worst = 0;
        for (int j = 0; j < n; j++)
            worst = fmax(worst, t[i * n + j] / best[j]);
        if (worst < worst_pick) {
            worst_pick = worst;
            pick = i;
        }
    }
    if (rc == DEAR_OK) {
        char name[sizeof plan->planner];
        snprintf(name, sizeof name, "est:%.27s", cand[pick].planner);
        dear_plan_free(plan);
        *plan = cand[pick];
        cand[pick] = (dear_plan_t){ 0 };
        snprintf(plan->planner, sizeof plan->planner, "%s", name);
        if (regret)
            *regret = worst_pick;
    }
out:
    for (int i = 0; prof && i < n; i++)
        dear_prof_free(&prof[i]);
    for (int i = 0; cand && i < n; i++)
        dear_plan_free(&cand[i]);
    free(prof);
    free(cand);
    free(t);
    free(best);
    return rc;
}

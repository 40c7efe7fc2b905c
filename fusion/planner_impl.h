/* What the planner files (plan_*.c, planner.c) share inside fusion/; not for other layers. */
#ifndef DEAR_FUSION_PLANNER_IMPL_H
#define DEAR_FUSION_PLANNER_IMPL_H

#include "fusion/planners.h"

/* A checked problem (profile with at least one tensor, a cost function): DEAR_OK, else
 * DEAR_ERR_ARG logged. */
int dear_planner_check(const dear_plan_problem_t *prob);
/* One bucket and one group holding every tensor. */
int dear_planner_one(dear_plan_t *plan, int n);
/* Per tensor: ready (from the backward's start) and need (from the forward's start, without
 * stalls) times, and bytes; the caller frees the three arrays. */
int dear_planner_times(const dear_profile_t *prof, double **ready, double **need, size_t **bytes);
/* The simulator's iteration time of a plan (INFINITY, *rc set, when it fails). */
double dear_planner_predict(const dear_plan_problem_t *prob, const dear_plan_t *plan, int *rc);
/* none or threshold over the problem's profile (their descriptor-based forms, plan.h). */
int dear_planner_from_descs(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_planner_t which);

/* GradSSA's seeds, in this order: none, one bucket, mgwfbp, dp, threshold. */
enum { DEAR_SSA_NSEEDS = 5 };
/* The search itself from given seeds (read only): auto passes the plans it already made. */
int dear_plan_gradssa_seeded(dear_plan_t *plan, const dear_plan_problem_t *prob,
                             const dear_plan_t seeds[DEAR_SSA_NSEEDS]);

#endif

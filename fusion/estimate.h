/*
 * Estimates: planning before anything is timed (SMSG's profiling-free modelling). What a plan
 * needs from a profile is how compute is spread over the layers and how it compares with the
 * communication; the model's structure gives the first, one number gives the second.
 *
 * Each layer gets a relative compute cost: its hint when it has one (dear_prof_layer_t.flops,
 * from dear_set_layer_cost, the PyTorch binding or a model description), else its dense parameter
 * bytes times the hinted layers' cost per dense byte (1 when no layer with parameters is hinted).
 * A row-sparse tensor (a token embedding) counts no bytes: its layer looks rows up. The one
 * unknown is the scale, seconds per unit of cost: given the forward and backward totals (the
 * first iteration's), dear_prof_estimate spreads each over the layers by cost; without them,
 * dear_plan_robust plans for a range of compute-to-communication ratios and keeps the plan whose
 * worst loss against the best plan of each ratio is least. Backward is taken as twice the
 * forward, as for a layer whose weight and input gradients each cost a forward. Pure C.
 */
#ifndef DEAR_FUSION_ESTIMATE_H
#define DEAR_FUSION_ESTIMATE_H

#include "fusion/planners.h"
#include "fusion/profile.h"

/* The cost of each layer of prof (nlayers entries into cost), as above. */
int dear_estimate_costs(const dear_profile_t *prof, double *cost);

/* out: prof's layers and tensors, each layer's forward fwd_s x its share of the cost and backward
 * bwd_s x the same share (every layer alike when no layer has a cost); no hints, times set
 * (no_times 0). *out is replaced only on success. */
int dear_prof_estimate(const dear_profile_t *prof, double fwd_s, double bwd_s, dear_profile_t *out);

/* The ratios dear_plan_robust plans for: compute (forward + backward) over the time of
 * communicating every gradient once, from lo to hi in npoints geometric steps (one point: their
 * geometric mean). */
typedef struct {
    double lo, hi;
    int npoints;
} dear_robust_range_t;

/* The compute-to-communication ratios the runtime plans for when it knows neither: the e2e
 * matrix's cases run from a third to three times, and overlap matters most around one. Five
 * points rather than three: with only the ends and the middle to choose from, a model whose
 * middle plan is poor at one end gets an end's plan, poor in the middle; the points between
 * offer a plan fair everywhere, and off the middle a point costs one split-free dp. */
#define DEAR_ROBUST_LO 0.25
#define DEAR_ROBUST_HI 4.0
#define DEAR_ROBUST_POINTS 5

/* Seconds of communicating every gradient of prof once under prob's cost and schedule: a
 * reduce-scatter and an all-gather of all of it for split schedules, else an all-reduce. */
double dear_estimate_comm_s(const dear_plan_problem_t *prob, const dear_profile_t *prof);

/* The planner an estimate is planned with, for a model-driven planner `which`: dp for auto and
 * gradssa, whose searches refine a plan for the profile they are given (here a rough one) at
 * several times dp's time; any other planner itself. */
dear_planner_t dear_estimate_planner(dear_planner_t which);

/* Plan prob->prof (an estimate at any scale: only the spread of its times counts) with planner
 * dear_estimate_planner(which) (off the middle point dp without its split search, all
 * all-gathers in the next forward) at each ratio of range, and keep
 * the candidate whose largest ratio of its predicted iteration to the best candidate's at the
 * same point is least (ties: the middle point's plan, then the earlier). *regret (may be NULL):
 * that largest ratio. The plan's name is "est:" and its planner's. */
int dear_plan_robust(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_planner_t which,
                     const dear_robust_range_t *range, double *regret);

/* The start training makes from a plan made from an estimate (DEAR_FIRST_MIN_GAIN): the plan
 * runs only when predicted faster than the threshold plan by at least min_gain of the threshold
 * plan's iteration, else the threshold plan does. Why: the estimate guesses the spread of compute
 * and prices collectives calibrated alone, so a smaller predicted gain lies within its error. */
typedef struct {
    double plan_s, thr_s; /* predicted iterations of the plan and of the threshold plan */
    double gain;          /* 1 - plan_s / thr_s (0 when thr_s is not positive) */
    double min_gain;      /* the share the gain was judged against */
    int threshold;        /* 1: training starts on the threshold plan */
} dear_first_start_t;

/* The decision from the two predictions. same: the plans are known equal, so the plan runs (it
 * is the threshold plan); 0 when not compared. NaN predictions start on the threshold plan. */
dear_first_start_t dear_first_start_decide(double plan_s, double thr_s, double min_gain, int same);

/* Both plans predicted on prob->prof with compute scaled to `ratio` times the time of
 * communicating every gradient once (ratio 0: at prob->prof's own times), and the decision
 * (same as for dear_first_start_decide). */
int dear_first_start(const dear_plan_problem_t *prob, const dear_plan_t *plan, const dear_plan_t *thr, double ratio,
                     double min_gain, int same, dear_first_start_t *out);

#endif

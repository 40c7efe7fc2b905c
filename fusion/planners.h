/*
 * The planners, one file each (plan_<name>.c), listed in base/planner_table.h. Each fills a
 * dear_plan_t (fusion/plan.h) for one schedule from a problem (profile, schedule, cost):
 *   none     one bucket per layer (WFBP);
 *   threshold buckets closed at prob->threshold bytes walking backward (Horovod, DDP, DeAR);
 *   mgwfbp   the published MG-WFBP greedy merge (Shi et al.) on the linear model, in backward
 *            order; the all-gather groups reuse the buckets (one bucketing, as published).
 *   dp       exact dynamic programmes for one FIFO channel, one per phase, on the problem's
 *            cost (any cost growing with bytes): reduce-scatter (all-reduce for wfbp) over
 *            backward ready times, and all-gather over forward need times (the derivation is in
 *            docs/FORMATS.md, "Planners"); for dear also the split between all-gathers run
 *            early (during backward, behind their buckets) and in the next forward, each split
 *            solved exactly and the best chosen by the simulator; with a bucket memory cap,
 *            only groups under the cap are admitted (still exact).
 *   gradssa  sparrow search (Xue & Shen 2020) over fusion vectors x in [0,1]^(n-1) per phase
 *            (and, for dear, the number of early all-gather groups), fitness = the simulator's
 *            iteration time under the problem's cost function (which may switch algorithm by
 *            size or cap bucket memory); seeded with none, one bucket, mgwfbp, dp and threshold
 *            plans; deterministic per seed; never worse than its seeds.
 *   auto     the lowest predicted of none, threshold, mgwfbp, dp and gradssa; for schedule dear
 *            per phase: the pair of one planner's buckets and another's all-gather groups with
 *            the best number of early groups (none where prob->no_early says so), then single
 *            groups moved into or out of backward where that predicts faster (any set); every
 *            other pair refined alike replaces it where predicted more than 1% faster.
 * Pure C.
 */
#ifndef DEAR_FUSION_PLANNERS_H
#define DEAR_FUSION_PLANNERS_H

#include <stddef.h>
#include <stdint.h>

#include "base/planner_table.h"
#include "fusion/cost.h"
#include "fusion/plan.h"
#include "fusion/profile.h"
#include "fusion/sim.h"

typedef struct {
    const dear_profile_t *prof;     /* checked profile */
    dear_sched_t sched;
    dear_sim_cost_t cost;           /* fitness of gradssa and the choice of auto */
    double alpha[DEAR_COLL_OP_COUNT];   /* linear model of mgwfbp and dp, per collective */
    double beta[DEAR_COLL_OP_COUNT];
    size_t threshold;               /* bytes, threshold planner and gradssa's threshold seed */
    size_t cap_bytes;               /* bucket memory cap for dp (0: none); gradssa sees it via cost */
    uint64_t seed;                  /* gradssa */
    int population;                 /* gradssa sparrows; 0: 100 */
    int rounds;                     /* gradssa rounds; 0: 100 */
    int no_early;                   /* dear: no all-gather may run during backward (sharded updates
                                     * whose slices are stepped only at backward_end: clipping,
                                     * DEAR_FIND_UNUSED, held, DEAR_SHARD_EARLY=0): every plan
                                     * has ag_early 0 */
    int shard;                      /* dear_sim_shard_t: sharded updates and where their slices are
                                     * stepped (fusion/sim.h) */
} dear_plan_problem_t;

/* Fill prob for a profile, schedule and cost model: linear lines from dear_cost_linear, the
 * cost function dear_sim_cost_model over `marg` (which must outlive prob; it is set to
 * {model, cap_bytes}), cap_bytes also for dp, threshold 25 MiB, seed 1. */
int dear_plan_problem_init(dear_plan_problem_t *prob, const dear_profile_t *prof, dear_sched_t sched,
                           const dear_cost_model_t *model, size_t cap_bytes, dear_sim_model_arg_t *marg);

/* Every planner of the table, by the entry point its row names (dear_plan_<name>, or _p where
 * plan.h already has a descriptor-based form). */
#define DEAR_PLANNER_DECL_(ID, NAME, FN, FLAGS, HELP) int FN(dear_plan_t *plan, const dear_plan_problem_t *prob);
DEAR_PLANNER_TABLE(DEAR_PLANNER_DECL_)
#undef DEAR_PLANNER_DECL_
/* dp for schedule dear with a given split m in 0..n: the all-gathers of tensors [m, n) run
 * early, each behind the bucket it is cut from (m = n: none early). For tests and tools. */
int dear_plan_dp_split(dear_plan_t *plan, const dear_plan_problem_t *prob, int m);
/* A planner of the table by id, or by name (DEAR_PLANNER_CHOICES); the name "one" gives a single
 * bucket (sync). An unknown name is DEAR_ERR_ARG, logged with the accepted names. */
int dear_plan_by_id(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_planner_t which);
/* auto's plan, as dear_plan_auto, and up to max runners-up, fastest predicted first (pred[k]
 * seconds), each with reduce-scatter buckets unlike the plan's and each other's: the other
 * candidates' buckets, and the plan's own with every two neighbouring buckets joined; each with
 * its best all-gather side. Named auto-K:WHO (K = 2, 3, ...). For auto's check, which measures
 * them in turn when the plan loses to the one it replaced. *nrun gets the count (at most
 * DEAR_AUTO_MAX_RUNNERS). tie (NULL: not wanted; tie_pred with it) gets the plan tied with the
 * plan, named auto-tie:WHO, or nothing (nunits 0): of the candidates' whole plans with buckets
 * unlike the plan's predicted within DEAR_AUTO_TIE of it, the one of the most collectives (else
 * their buckets with the plan's all-gather side, the most buckets). Auto's check measures it
 * against the plan when the plan stays. */
#define DEAR_AUTO_MAX_RUNNERS 8
/* Plans predicted within this share of each other are tied: the model's errors on the e2e matrix
 * are larger (docs/PERFORMANCE.md), and auto's check resolves no finer (its floor,
 * VERIFY_TOLERANCE, is the same share). */
#define DEAR_AUTO_TIE 0.02
int dear_plan_auto_runners(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_plan_t *runners, double *pred,
                           int max, int *nrun, dear_plan_t *tie, double *tie_pred);
int dear_plan_by_name(dear_plan_t *plan, const dear_plan_problem_t *prob, const char *name);

#endif

/* Planner auto: the lowest predicted iteration time of every candidate planner's plan; for
 * schedule dear per phase (one planner's buckets with another's all-gather groups) and with the
 * best number of early all-gather groups. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fusion/planner_impl.h"
#include "include/dear_types.h"

int dear_plan_auto(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    int rc = dear_planner_check(prob);
    if (rc != DEAR_OK)
        return rc;
    /* The candidates: the planners of the table flagged DEAR_PLANNER_F_CANDIDATE, in its order
     * (ties keep the earlier). gradssa would make the others' plans again as its seeds, so it is
     * made last, from them. */
    dear_planner_t cand[DEAR_PLANNER_COUNT];
    int NC = 0, ssa = -1, at[DEAR_PLANNER_COUNT];
    for (int k = 0; k < DEAR_PLANNER_COUNT; k++) {
        at[k] = -1;
        if (dear_planner_flags((dear_planner_t)k) & DEAR_PLANNER_F_CANDIDATE) {
            at[k] = NC;
            cand[NC++] = (dear_planner_t)k;
        }
    }
    ssa = at[DEAR_PLANNER_GRADSSA];
    dear_plan_t p[DEAR_PLANNER_COUNT];
    memset(p, 0, sizeof p);
    for (int c = 0; c < NC && rc == DEAR_OK; c++)
        if (c != ssa)
            rc = dear_plan_by_id(&p[c], prob, cand[c]);
    int seeded = at[DEAR_PLANNER_NONE] >= 0 && at[DEAR_PLANNER_MGWFBP] >= 0 && at[DEAR_PLANNER_DP] >= 0 &&
                 at[DEAR_PLANNER_THRESHOLD] >= 0;
    if (rc == DEAR_OK && ssa >= 0 &&
        (!seeded || prob->sched == DEAR_SCHED_SYNC || prob->prof->ntensors == 1)) {
        rc = dear_plan_gradssa(&p[ssa], prob);
    } else if (rc == DEAR_OK && ssa >= 0) {
        dear_plan_t one = { 0 };
        rc = dear_planner_one(&one, prob->prof->ntensors);
        if (rc == DEAR_OK) {
            const dear_plan_t seeds[DEAR_SSA_NSEEDS] = { p[at[DEAR_PLANNER_NONE]], one, p[at[DEAR_PLANNER_MGWFBP]],
                                                         p[at[DEAR_PLANNER_DP]], p[at[DEAR_PLANNER_THRESHOLD]] };
            rc = dear_plan_gradssa_seeded(&p[ssa], prob, seeds);
        }
        dear_plan_free(&one);
    }
    /* Schedule dear has two independent phases: every pair (reduce-scatter buckets of one
     * planner, all-gather groups of another) is simulated. The others only have buckets. */
    int nag = prob->sched == DEAR_SCHED_DEAR ? NC : 1, bi = 0, bj = 0, be = 0;
    double best = INFINITY;
    for (int i = 0; i < NC && rc == DEAR_OK; i++)
        for (int j = 0; j < nag && rc == DEAR_OK; j++) {
            int k = nag > 1 ? j : i;
            /* dear: also every number of early all-gather groups (0 = all in the forward). */
            int emax = nag > 1 && !prob->no_early ? p[k].ag.ngroups : 0;
            for (int ne = 0; ne <= emax && rc == DEAR_OK; ne++) {
                dear_plan_t mix = { .nunits = p[i].nunits, .ntensors = p[i].ntensors, .rs = p[i].rs, .ag = p[k].ag, .ag_early = ne };
                double t = dear_planner_predict(prob, &mix, &rc);
                if (t < best) { /* ties keep the earlier, simpler choice */
                    best = t;
                    bi = i;
                    bj = k;
                    be = ne;
                }
            }
        }
    dear_plan_t res = { 0 };
    if (rc == DEAR_OK) {
        res.nunits = res.ntensors = p[bi].nunits;
        rc = dear_partition_set(&res.rs, res.nunits, p[bi].rs.ngroups, p[bi].rs.first);
    }
    if (rc == DEAR_OK)
        rc = dear_partition_set(&res.ag, res.nunits, p[bj].ag.ngroups, p[bj].ag.first);
    if (rc == DEAR_OK) {
        res.ag_early = be;
        if (bi == bj)
            snprintf(res.planner, sizeof res.planner, "auto:%.26s", p[bi].planner);
        else
            snprintf(res.planner, sizeof res.planner, "auto:%.12s+%.12s", p[bi].planner, p[bj].planner);
        dear_plan_free(plan);
        *plan = res;
    } else {
        dear_plan_free(&res);
    }
    for (int c = 0; c < NC; c++)
        dear_plan_free(&p[c]);
    return rc;
}

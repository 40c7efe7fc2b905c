/* Planner mgwfbp: the published MG-WFBP greedy merge (Shi et al.) on the linear cost model, in
 * backward order; the all-gather groups reuse the buckets (one bucketing, as published). A sparse
 * tensor counts with the bytes it puts on the wire. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fusion/planner_impl.h"
#include "include/dear_types.h"

/* The linear model's bytes for a tensor: a sparse all-reduce is a reduce-scatter and an
 * all-gather of their own wire bytes, each about half an all-reduce of the same bytes. */
static double wire_bytes(const dear_prof_tensor_t *t, dear_coll_op_t op)
{
    if (op != DEAR_COLL_ALLREDUCE)
        return dear_prof_wire_bytes(t, op);
    return 0.5 * (dear_prof_wire_bytes(t, DEAR_COLL_REDUCE_SCATTER) + dear_prof_wire_bytes(t, DEAR_COLL_ALLGATHER));
}

int dear_plan_mgwfbp(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    int rc = dear_planner_check(prob);
    if (rc != DEAR_OK)
        return rc;
    int n = prob->prof->ntensors;
    if (prob->sched == DEAR_SCHED_SYNC) {
        rc = dear_planner_one(plan, n);
        if (rc == DEAR_OK)
            snprintf(plan->planner, sizeof plan->planner, "mgwfbp");
        return rc;
    }
    dear_coll_op_t op = prob->sched == DEAR_SCHED_WFBP ? DEAR_COLL_ALLREDUCE : DEAR_COLL_REDUCE_SCATTER;
    double a = prob->alpha[op], b = prob->beta[op];
    double *ready, *need;
    size_t *bytes;
    rc = dear_planner_times(prob->prof, &ready, &need, &bytes);
    if (rc != DEAR_OK)
        return rc;
    int *first = malloc(sizeof(int) * (size_t)(n + 1));
    if (!first) {
        free(ready);
        free(need);
        free(bytes);
        return DEAR_ERR_NOMEM;
    }
    /* Walk backward order; the current group's communication would start at s. Tensor t joins
     * it iff t's gradient is ready before s + a: waiting for t costs less than a start-up. */
    for (int t = 0; t < n; t++)
        bytes[t] = (size_t)llround(wire_bytes(&prob->prof->tensors[t], op));
    int ng = 0;
    double prev_end = -INFINITY;
    double gbytes = (double)bytes[n - 1];
    double s = ready[n - 1];
    for (int t = n - 2; t >= 0; t--) {
        if (ready[t] < s + a) {
            gbytes += (double)bytes[t];
            s = prev_end > ready[t] ? prev_end : ready[t];
        } else {
            prev_end = s + a + b * gbytes;
            first[ng++] = t + 1;
            gbytes = (double)bytes[t];
            s = prev_end > ready[t] ? prev_end : ready[t];
        }
    }
    first[ng++] = 0;
    /* Starts were collected in backward order: reverse them into forward order. */
    for (int i = 0, j = ng - 1; i < j; i++, j--) {
        int x = first[i];
        first[i] = first[j];
        first[j] = x;
    }
    first[ng] = n;
    rc = dear_plan_set(plan, n, ng, first, ng, first, "mgwfbp");
    free(first);
    free(ready);
    free(need);
    free(bytes);
    return rc;
}


/* Planner none: one bucket per layer (WFBP), the same partition for both phases. */
#include <stdlib.h>

#include "fusion/planner_impl.h"
#include "include/dear_types.h"

int dear_plan_none(dear_plan_t *plan, int ntensors, const dear_tensor_desc_t *tensors)
{
    if (ntensors < 0 || (ntensors > 0 && !tensors))
        return DEAR_ERR_ARG;
    int *first = malloc(sizeof(int) * (size_t)(ntensors + 1));
    if (!first)
        return DEAR_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < ntensors; i++)
        if (i == 0 || tensors[i].layer != tensors[i - 1].layer)
            first[n++] = i;
    first[n] = ntensors;
    int rc = dear_plan_same(plan, ntensors, n, first, "none");
    free(first);
    return rc;
}

int dear_plan_none_p(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    return dear_planner_from_descs(plan, prob, DEAR_PLANNER_NONE);
}

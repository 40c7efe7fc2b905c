/* Planner none: one bucket per layer (WFBP), and one per chunk of a cut tensor, the same
 * partition for both phases: no fusion at all, as ByteScheduler sends each partition alone. */
#include <stdlib.h>

#include "fusion/planner_impl.h"
#include "include/dear_types.h"

int dear_plan_none(dear_plan_t *plan, int nunits, const dear_tensor_desc_t *units)
{
    if (nunits < 0 || (nunits > 0 && !units))
        return DEAR_ERR_ARG;
    int *first = malloc(sizeof(int) * (size_t)(nunits + 1));
    if (!first)
        return DEAR_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < nunits; i++)
        if (i == 0 || units[i].layer != units[i - 1].layer || units[i].nchunks > 1 || units[i - 1].nchunks > 1)
            first[n++] = i;
    first[n] = nunits;
    int rc = dear_plan_same(plan, nunits, n, first, "none");
    free(first);
    return rc;
}

int dear_plan_none_p(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    return dear_planner_from_descs(plan, prob, DEAR_PLANNER_NONE);
}

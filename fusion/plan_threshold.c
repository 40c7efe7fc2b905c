/* Planner threshold: walking backward from the last unit, a bucket is closed once it holds at
 * least the threshold's bytes (Horovod, PyTorch DDP, DeAR); the same partition for both phases. */
#include <stdlib.h>

#include "fusion/planner_impl.h"
#include "include/dear_types.h"

int dear_plan_threshold(dear_plan_t *plan, int nunits, const dear_tensor_desc_t *units, size_t threshold)
{
    if (nunits < 0 || (nunits > 0 && !units) || threshold == 0)
        return DEAR_ERR_ARG;
    int *first = malloc(sizeof(int) * (size_t)(nunits + 1));
    if (!first)
        return DEAR_ERR_NOMEM;
    /* Collect bucket starts walking backward, then reverse them into forward order. */
    int n = 0;
    size_t acc = 0;
    for (int i = nunits - 1; i >= 0; i--) {
        acc += units[i].bytes;
        if (acc >= threshold || i == 0) {
            first[n++] = i;
            acc = 0;
        }
    }
    for (int a = 0, b = n - 1; a < b; a++, b--) {
        int t = first[a];
        first[a] = first[b];
        first[b] = t;
    }
    first[n] = nunits;
    int rc = dear_plan_same(plan, nunits, n, first, "threshold");
    free(first);
    return rc;
}

int dear_plan_threshold_p(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    return dear_planner_from_descs(plan, prob, DEAR_PLANNER_THRESHOLD);
}

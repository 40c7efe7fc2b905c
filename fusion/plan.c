/* Plan structs: partitions, validation, copies, comparison and printing. The planners (one file
 * each, plan_*.c) fill the same struct. */
#include "fusion/plan.h"

#include <stdlib.h>
#include <string.h>

#include "include/dear_types.h"

int dear_partition_set(dear_partition_t *p, int ntensors, int ngroups, const int *first)
{
    if (ntensors < 0 || ngroups < 0 || (ntensors > 0 && ngroups < 1) || first == NULL)
        return DEAR_ERR_ARG;
    if (first[0] != 0 || first[ngroups] != ntensors)
        return DEAR_ERR_ARG;
    for (int g = 0; g < ngroups; g++)
        if (first[g + 1] <= first[g])
            return DEAR_ERR_ARG;
    int *copy = malloc(sizeof(int) * (size_t)(ngroups + 1));
    if (!copy)
        return DEAR_ERR_NOMEM;
    memcpy(copy, first, sizeof(int) * (size_t)(ngroups + 1));
    free(p->first);
    p->first = copy;
    p->ngroups = ngroups;
    return DEAR_OK;
}

void dear_partition_free(dear_partition_t *p)
{
    free(p->first);
    p->first = NULL;
    p->ngroups = 0;
}

int dear_partition_group_of(const dear_partition_t *p, int t)
{
    int lo = 0, hi = p->ngroups - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (p->first[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void dear_plan_free(dear_plan_t *plan)
{
    if (!plan)
        return;
    dear_partition_free(&plan->rs);
    dear_partition_free(&plan->ag);
    plan->ntensors = 0;
}

int dear_plan_copy(dear_plan_t *dst, const dear_plan_t *src)
{
    dear_plan_t tmp = { 0 };
    int rc = dear_partition_set(&tmp.rs, src->ntensors, src->rs.ngroups, src->rs.first);
    if (rc == DEAR_OK)
        rc = dear_partition_set(&tmp.ag, src->ntensors, src->ag.ngroups, src->ag.first);
    if (rc != DEAR_OK) {
        dear_plan_free(&tmp);
        return rc;
    }
    tmp.ntensors = src->ntensors;
    tmp.ag_early = src->ag_early;
    memcpy(tmp.planner, src->planner, sizeof tmp.planner);
    dear_plan_free(dst);
    *dst = tmp;
    return DEAR_OK;
}

static int partition_check(const dear_partition_t *p, int ntensors, const char *what, char *msg, size_t len)
{
    if (ntensors == 0 && p->ngroups == 0)
        return DEAR_OK;
    if (p->ngroups < 1 || p->first == NULL) {
        snprintf(msg, len, "%s partition has no groups for %d tensors", what, ntensors);
        return DEAR_ERR_FORMAT;
    }
    if (p->first[0] != 0 || p->first[p->ngroups] != ntensors) {
        snprintf(msg, len, "%s partition covers tensors %d..%d, expected 0..%d", what, p->first[0],
                 p->first[p->ngroups] - 1, ntensors - 1);
        return DEAR_ERR_FORMAT;
    }
    for (int g = 0; g < p->ngroups; g++)
        if (p->first[g + 1] <= p->first[g]) {
            snprintf(msg, len, "%s group %d is empty or out of order (starts at %d, next at %d)", what, g,
                     p->first[g], p->first[g + 1]);
            return DEAR_ERR_FORMAT;
        }
    return DEAR_OK;
}

int dear_plan_validate(const dear_plan_t *plan, int ntensors, char *msg, size_t msglen)
{
    if (plan->ntensors != ntensors) {
        snprintf(msg, msglen, "plan is for %d tensors, %d are registered", plan->ntensors, ntensors);
        return DEAR_ERR_FORMAT;
    }
    int rc = partition_check(&plan->rs, ntensors, "reduce-scatter", msg, msglen);
    if (rc == DEAR_OK)
        rc = partition_check(&plan->ag, ntensors, "all-gather", msg, msglen);
    if (rc == DEAR_OK && (plan->ag_early < 0 || plan->ag_early > plan->ag.ngroups)) {
        snprintf(msg, msglen, "%d early all-gather group(s), expected 0..%d (the all-gather groups)", plan->ag_early,
                 plan->ag.ngroups);
        rc = DEAR_ERR_FORMAT;
    }
    return rc;
}

static int partition_equal(const dear_partition_t *a, const dear_partition_t *b)
{
    return a->ngroups == b->ngroups &&
           (a->ngroups == 0 || memcmp(a->first, b->first, sizeof(int) * (size_t)(a->ngroups + 1)) == 0);
}

int dear_plan_equal(const dear_plan_t *a, const dear_plan_t *b)
{
    return a->ntensors == b->ntensors && a->ag_early == b->ag_early && partition_equal(&a->rs, &b->rs) &&
           partition_equal(&a->ag, &b->ag);
}

static void partition_print(FILE *out, const char *what, const dear_partition_t *p, const dear_tensor_desc_t *t)
{
    fprintf(out, "  %s: %d group(s)\n", what, p->ngroups);
    for (int g = 0; g < p->ngroups; g++) {
        size_t bytes = 0;
        for (int i = p->first[g]; t && i < p->first[g + 1]; i++)
            bytes += t[i].bytes;
        fprintf(out, "    %3d: tensors %d..%d", g, p->first[g], p->first[g + 1] - 1);
        if (t)
            fprintf(out, " (%zu bytes)", bytes);
        fputc('\n', out);
    }
}

void dear_plan_print(FILE *out, const dear_plan_t *plan, const dear_tensor_desc_t *tensors)
{
    fprintf(out, "plan (%s) for %d tensors\n", plan->planner[0] ? plan->planner : "?", plan->ntensors);
    partition_print(out, "reduce-scatter buckets", &plan->rs, tensors);
    partition_print(out, "all-gather groups", &plan->ag, tensors);
    if (plan->ag_early > 0)
        fprintf(out, "  early all-gather groups (during backward): %d..%d\n", plan->ag.ngroups - plan->ag_early,
                plan->ag.ngroups - 1);
}

int dear_plan_set(dear_plan_t *plan, int ntensors, int nrs, const int *rs_first, int nag, const int *ag_first,
                  const char *planner)
{
    dear_plan_t tmp = { 0 };
    int rc = dear_partition_set(&tmp.rs, ntensors, nrs, rs_first);
    if (rc == DEAR_OK)
        rc = dear_partition_set(&tmp.ag, ntensors, nag, ag_first);
    if (rc != DEAR_OK) {
        dear_plan_free(&tmp);
        return rc;
    }
    tmp.ntensors = ntensors;
    snprintf(tmp.planner, sizeof tmp.planner, "%s", planner);
    dear_plan_free(plan);
    *plan = tmp;
    return DEAR_OK;
}

/* Both phases get the same partition, built from boundaries in forward order. */
int dear_plan_same(dear_plan_t *plan, int ntensors, int ngroups, const int *first, const char *name)
{
    return dear_plan_set(plan, ntensors, ngroups, first, ngroups, first, name);
}

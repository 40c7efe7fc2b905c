/* Plan structs: partitions, units, validation, copies, comparison and printing. The planners
 * (one file each, plan_*.c) fill the same struct; the unit cut is fusion/units.c. */
#include "fusion/plan.h"

#include <stdlib.h>
#include <string.h>

#include "include/dear_types.h"

int dear_partition_set(dear_partition_t *p, int nunits, int ngroups, const int *first)
{
    if (nunits < 0 || ngroups < 0 || (nunits > 0 && ngroups < 1) || first == NULL)
        return DEAR_ERR_ARG;
    if (first[0] != 0 || first[ngroups] != nunits)
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

void dear_plan_free(dear_plan_t *plan)
{
    if (!plan)
        return;
    dear_partition_free(&plan->rs);
    dear_partition_free(&plan->ag);
    free(plan->units);
    plan->units = NULL;
    free(plan->early);
    plan->early = NULL;
    plan->ag_early = 0;
    plan->nunits = plan->ntensors = 0;
}

/* A copy of n units, or NULL for none (whole tensors); *rc set on failure. */
static dear_unit_t *units_dup(const dear_unit_t *u, int n, int *rc)
{
    if (!u)
        return NULL;
    dear_unit_t *c = malloc(sizeof *c * (size_t)(n > 0 ? n : 1));
    if (!c)
        *rc = DEAR_ERR_NOMEM;
    else
        memcpy(c, u, sizeof *c * (size_t)n);
    return c;
}

int dear_plan_copy(dear_plan_t *dst, const dear_plan_t *src)
{
    dear_plan_t tmp = { 0 };
    int rc = dear_partition_set(&tmp.rs, src->nunits, src->rs.ngroups, src->rs.first);
    if (rc == DEAR_OK)
        rc = dear_partition_set(&tmp.ag, src->nunits, src->ag.ngroups, src->ag.first);
    if (rc == DEAR_OK)
        tmp.units = units_dup(src->units, src->nunits, &rc);
    if (rc == DEAR_OK && src->early) {
        tmp.early = malloc((size_t)src->ag.ngroups);
        if (tmp.early)
            memcpy(tmp.early, src->early, (size_t)src->ag.ngroups);
        else
            rc = DEAR_ERR_NOMEM;
    }
    if (rc != DEAR_OK) {
        dear_plan_free(&tmp);
        return rc;
    }
    tmp.nunits = src->nunits;
    tmp.ntensors = src->ntensors;
    tmp.ag_early = src->ag_early;
    memcpy(tmp.planner, src->planner, sizeof tmp.planner);
    dear_plan_free(dst);
    *dst = tmp;
    return DEAR_OK;
}

static int partition_check(const dear_partition_t *p, int nunits, const char *what, char *msg, size_t len)
{
    if (nunits == 0 && p->ngroups == 0)
        return DEAR_OK;
    if (p->ngroups < 1 || p->first == NULL) {
        snprintf(msg, len, "%s partition has no groups for %d units", what, nunits);
        return DEAR_ERR_FORMAT;
    }
    if (p->first[0] != 0 || p->first[p->ngroups] != nunits) {
        snprintf(msg, len, "%s partition covers units %d..%d, expected 0..%d", what, p->first[0],
                 p->first[p->ngroups] - 1, nunits - 1);
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

/* Units in tensor order, each tensor whole ({t, 0, 0}) or chunks of it back to back from byte 0. */
static int units_check(const dear_unit_t *u, int nunits, int ntensors, char *msg, size_t len)
{
    int t = 0;
    for (int i = 0; i < nunits; i++) {
        int cont = i > 0 && u[i].tensor == u[i - 1].tensor;
        if (!cont && u[i].tensor != t) {
            snprintf(msg, len, "unit %d belongs to tensor %d, expected tensor %d (units cover the tensors in order)", i,
                     u[i].tensor, t);
            return DEAR_ERR_FORMAT;
        }
        if (cont ? (u[i - 1].bytes == 0 || u[i].bytes == 0 || u[i].offset != u[i - 1].offset + u[i - 1].bytes)
                 : (u[i].offset != 0 || (u[i].bytes > 0 && (i + 1 == nunits || u[i + 1].tensor != t)))) {
            snprintf(msg, len, "unit %d (tensor %d, bytes %zu..%zu) is not the next chunk of its tensor (chunks lie "
                     "back to back from byte 0, at least two of them, each non-empty)", i, u[i].tensor, u[i].offset,
                     u[i].offset + u[i].bytes);
            return DEAR_ERR_FORMAT;
        }
        if (!cont)
            t++;
    }
    if (t != ntensors) {
        snprintf(msg, len, "the units cover %d tensors, the plan is for %d", t, ntensors);
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
    if (!plan->units && plan->nunits != ntensors) {
        snprintf(msg, msglen, "plan has %d units and no cuts for %d tensors", plan->nunits, ntensors);
        return DEAR_ERR_FORMAT;
    }
    int rc = plan->units ? units_check(plan->units, plan->nunits, ntensors, msg, msglen) : DEAR_OK;
    if (rc == DEAR_OK)
        rc = partition_check(&plan->rs, plan->nunits, "reduce-scatter", msg, msglen);
    if (rc == DEAR_OK)
        rc = partition_check(&plan->ag, plan->nunits, "all-gather", msg, msglen);
    if (rc == DEAR_OK && (plan->ag_early < 0 || plan->ag_early > plan->ag.ngroups)) {
        snprintf(msg, msglen, "%d early all-gather group(s), expected 0..%d (the all-gather groups)", plan->ag_early,
                 plan->ag.ngroups);
        rc = DEAR_ERR_FORMAT;
    }
    int marked = 0;
    for (int g = 0; rc == DEAR_OK && plan->early && g < plan->ag.ngroups; g++) {
        if (plan->early[g] > 1) {
            snprintf(msg, msglen, "early mark %d of all-gather group %d, expected 0 or 1", plan->early[g], g);
            rc = DEAR_ERR_FORMAT;
        }
        marked += plan->early[g];
    }
    if (rc == DEAR_OK && plan->early && marked != plan->ag_early) {
        snprintf(msg, msglen, "%d all-gather group(s) marked early, the plan counts %d", marked, plan->ag_early);
        rc = DEAR_ERR_FORMAT;
    }
    return rc;
}

int dear_plan_is_early(const dear_plan_t *plan, int g)
{
    return plan->early ? plan->early[g] != 0 : g >= plan->ag.ngroups - plan->ag_early;
}

int dear_plan_set_early(dear_plan_t *plan, const unsigned char *early)
{
    int n = plan->ag.ngroups, count = 0, lo = n;
    for (int g = 0; early && g < n; g++)
        if (early[g]) {
            count++;
            lo = g < lo ? g : lo;
        }
    unsigned char *copy = NULL;
    if (count > 0 && n - lo != count) { /* not a trailing run */
        copy = malloc((size_t)n);
        if (!copy)
            return DEAR_ERR_NOMEM;
        for (int g = 0; g < n; g++)
            copy[g] = early[g] != 0;
    }
    free(plan->early);
    plan->early = copy;
    plan->ag_early = count;
    return DEAR_OK;
}

int dear_partition_equal(const dear_partition_t *a, const dear_partition_t *b)
{
    return a->ngroups == b->ngroups &&
           (a->ngroups == 0 || memcmp(a->first, b->first, sizeof(int) * (size_t)(a->ngroups + 1)) == 0);
}

/* Unit i of a plan, a whole tensor spelt out when the plan cuts none. */
static dear_unit_t unit_at(const dear_plan_t *p, int i)
{
    return p->units ? p->units[i] : (dear_unit_t){ .tensor = i };
}

int dear_plan_equal(const dear_plan_t *a, const dear_plan_t *b)
{
    if (a->nunits != b->nunits || a->ntensors != b->ntensors)
        return 0;
    for (int i = 0; (a->units || b->units) && i < a->nunits; i++) {
        dear_unit_t x = unit_at(a, i), y = unit_at(b, i);
        if (x.tensor != y.tensor || x.offset != y.offset || x.bytes != y.bytes)
            return 0;
    }
    if (a->ag_early != b->ag_early || !dear_partition_equal(&a->rs, &b->rs) || !dear_partition_equal(&a->ag, &b->ag))
        return 0;
    for (int g = 0; (a->early || b->early) && g < a->ag.ngroups; g++)
        if (dear_plan_is_early(a, g) != dear_plan_is_early(b, g))
            return 0;
    return 1;
}

static void partition_print(FILE *out, const char *what, const dear_partition_t *p, const dear_tensor_desc_t *t)
{
    fprintf(out, "  %s: %d group(s)\n", what, p->ngroups);
    for (int g = 0; g < p->ngroups; g++) {
        size_t bytes = 0;
        for (int i = p->first[g]; t && i < p->first[g + 1]; i++)
            bytes += t[i].bytes;
        fprintf(out, "    %3d: units %d..%d", g, p->first[g], p->first[g + 1] - 1);
        if (t)
            fprintf(out, " (%zu bytes)", bytes);
        fputc('\n', out);
    }
}

void dear_plan_print(FILE *out, const dear_plan_t *plan, const dear_tensor_desc_t *units)
{
    fprintf(out, "plan (%s) for %d tensors in %d units\n", plan->planner[0] ? plan->planner : "?", plan->ntensors,
            plan->nunits);
    for (int i = 0; plan->units && i < plan->nunits; i++)
        if (plan->units[i].bytes > 0 && plan->units[i].offset == 0) {
            int k = i;
            while (k < plan->nunits && plan->units[k].tensor == plan->units[i].tensor)
                k++;
            fprintf(out, "  tensor %d cut into units %d..%d of about %zu bytes\n", plan->units[i].tensor, i, k - 1,
                    plan->units[i].bytes);
        }
    partition_print(out, "reduce-scatter buckets", &plan->rs, units);
    partition_print(out, "all-gather groups", &plan->ag, units);
    if (plan->ag_early == 0)
        return;
    fprintf(out, "  early all-gather groups (during backward):");
    for (int g = 0; g < plan->ag.ngroups; g++) {
        if (!dear_plan_is_early(plan, g) || (g > 0 && dear_plan_is_early(plan, g - 1)))
            continue;
        int k = g;
        while (k + 1 < plan->ag.ngroups && dear_plan_is_early(plan, k + 1))
            k++;
        if (k > g)
            fprintf(out, " %d..%d", g, k);
        else
            fprintf(out, " %d", g);
    }
    fputc('\n', out);
}

int dear_plan_set(dear_plan_t *plan, int nunits, int nrs, const int *rs_first, int nag, const int *ag_first,
                  const char *planner)
{
    dear_plan_t tmp = { 0 };
    int rc = dear_partition_set(&tmp.rs, nunits, nrs, rs_first);
    if (rc == DEAR_OK)
        rc = dear_partition_set(&tmp.ag, nunits, nag, ag_first);
    if (rc != DEAR_OK) {
        dear_plan_free(&tmp);
        return rc;
    }
    tmp.nunits = tmp.ntensors = nunits;
    snprintf(tmp.planner, sizeof tmp.planner, "%s", planner);
    dear_plan_free(plan);
    *plan = tmp;
    return DEAR_OK;
}

int dear_plan_set_units(dear_plan_t *plan, int ntensors, const dear_unit_t *units)
{
    int rc = DEAR_OK, cut = 0;
    for (int i = 0; units && i < plan->nunits && !cut; i++)
        cut = units[i].bytes > 0;
    dear_unit_t *copy = cut ? units_dup(units, plan->nunits, &rc) : NULL;
    if (rc != DEAR_OK)
        return rc;
    dear_plan_t tmp = *plan;
    tmp.ntensors = ntensors;
    tmp.units = copy;
    char msg[256];
    if (dear_plan_validate(&tmp, ntensors, msg, sizeof msg) != DEAR_OK) {
        free(copy);
        return DEAR_ERR_ARG;
    }
    free(plan->units);
    *plan = tmp;
    return DEAR_OK;
}

/* Both phases get the same partition, built from boundaries in forward order. */
int dear_plan_same(dear_plan_t *plan, int nunits, int ngroups, const int *first, const char *name)
{
    return dear_plan_set(plan, nunits, ngroups, first, ngroups, first, name);
}

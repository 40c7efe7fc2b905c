/* What every planner shares: the problem, its checks, the tensors' ready and need times, and
 * the planner table (base/planner_table.h) behind dear_plan_by_name. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fusion/planner_impl.h"
#include "include/dear_types.h"

int dear_plan_problem_init(dear_plan_problem_t *prob, const dear_profile_t *prof, dear_sched_t sched,
                           const dear_cost_model_t *model, size_t cap_bytes, dear_sim_model_arg_t *marg)
{
    if (!prob || !prof || !model || !marg || (unsigned)sched >= DEAR_SCHED_COUNT)
        return DEAR_ERR_ARG;
    dear_plan_problem_t p = { .prof = prof, .sched = sched, .threshold = 25u << 20, .seed = 1 };
    /* The schedule's collectives must be priced; another may be missing (the runtime measures
     * only what its schedule runs) and is then infinitely expensive. */
    int split = (dear_sched_flags(sched) & DEAR_SCHED_F_SPLIT) != 0;
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        int needed = op == DEAR_COLL_ALLREDUCE ? !split : split;
        if (!needed && !isfinite(dear_cost_eval(model, (dear_coll_op_t)op, 1 << 20, NULL))) {
            p.alpha[op] = p.beta[op] = INFINITY;
            continue;
        }
        int rc = dear_cost_linear(model, (dear_coll_op_t)op, &p.alpha[op], &p.beta[op]);
        if (rc != DEAR_OK)
            return rc;
    }
    marg->model = model;
    marg->cap_bytes = cap_bytes;
    p.cap_bytes = cap_bytes;
    p.cost = dear_sim_model_cost(marg);
    *prob = p;
    return DEAR_OK;
}

int dear_planner_one(dear_plan_t *plan, int n)
{
    int first[2] = { 0, n };
    return dear_plan_set(plan, n, 1, first, 1, first, "one");
}

int dear_planner_times(const dear_profile_t *prof, double **ready, double **need, size_t **bytes)
{
    int n = prof->ntensors, nl = prof->nlayers;
    double *r = malloc(sizeof(double) * (size_t)n), *q = malloc(sizeof(double) * (size_t)n);
    double *bdone = malloc(sizeof(double) * (size_t)nl), *fstart = malloc(sizeof(double) * (size_t)nl);
    size_t *b = malloc(sizeof(size_t) * (size_t)n);
    if (!r || !q || !bdone || !fstart || !b) {
        free(r);
        free(q);
        free(bdone);
        free(fstart);
        free(b);
        return DEAR_ERR_NOMEM;
    }
    double acc = 0;
    for (int l = nl - 1; l >= 0; l--) {
        acc += prof->layers[l].bwd_s;
        bdone[l] = acc;
    }
    acc = 0;
    for (int l = 0; l < nl; l++) {
        fstart[l] = acc;
        acc += prof->layers[l].fwd_s;
    }
    for (int t = 0; t < n; t++) {
        r[t] = bdone[prof->tensors[t].lidx];
        q[t] = fstart[prof->tensors[t].lidx];
        b[t] = prof->tensors[t].bytes;
    }
    free(bdone);
    free(fstart);
    *ready = r;
    *need = q;
    *bytes = b;
    return DEAR_OK;
}

int dear_planner_check(const dear_plan_problem_t *prob)
{
    if (!prob || !prob->prof || prob->prof->ntensors < 1 || !prob->cost.fn) {
        DEAR_ERROR("plan", "planner needs a checked profile with at least one tensor and a cost function");
        return DEAR_ERR_ARG;
    }
    for (int t = 0; t < prob->prof->ntensors; t++)
        if (prob->prof->tensors[t].lidx < 0) {
            DEAR_ERROR("plan", "profile is not checked (tensor %d has no layer index)", t);
            return DEAR_ERR_ARG;
        }
    return DEAR_OK;
}

double dear_planner_predict(const dear_plan_problem_t *prob, const dear_plan_t *plan, int *rc)
{
    dear_sim_result_t r = { 0 };
    *rc = dear_sim_run_ex(prob->prof, &prob->cost, prob->sched, plan, prob->shard, 0, &r);
    return *rc == DEAR_OK ? r.iter_s : INFINITY;
}

int dear_planner_from_descs(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_planner_t which)
{
    dear_tensor_desc_t *descs;
    int rc = dear_planner_check(prob);
    if (rc != DEAR_OK)
        return rc;
    rc = dear_prof_descs(prob->prof, &descs);
    if (rc != DEAR_OK)
        return rc;
    if (which == DEAR_PLANNER_THRESHOLD)
        rc = dear_plan_threshold(plan, prob->prof->ntensors, descs, prob->threshold ? prob->threshold : 1);
    else
        rc = dear_plan_none(plan, prob->prof->ntensors, descs);
    free(descs);
    return rc;
}

/* ---- the table ---- */

typedef int (*planner_fn_t)(dear_plan_t *, const dear_plan_problem_t *);
#define PLANNER_FN_(ID, NAME, FN, FLAGS, HELP) [DEAR_PLANNER_##ID] = FN,
static const planner_fn_t planner_fns[DEAR_PLANNER_COUNT] = { DEAR_PLANNER_TABLE(PLANNER_FN_) };
#undef PLANNER_FN_

int dear_plan_by_id(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_planner_t which)
{
    if ((unsigned)which >= DEAR_PLANNER_COUNT)
        return DEAR_ERR_ARG;
    return planner_fns[which](plan, prob);
}

int dear_plan_by_name(dear_plan_t *plan, const dear_plan_problem_t *prob, const char *name)
{
    dear_planner_t which;
    if (!name)
        return DEAR_ERR_ARG;
    if (strcmp(name, "one") == 0)
        return dear_planner_check(prob) == DEAR_OK ? dear_planner_one(plan, prob->prof->ntensors) : DEAR_ERR_ARG;
    if (dear_planner_parse(name, &which) != 0) {
        DEAR_ERROR("plan", "unknown planner '%s' (accepted: %s)", name, DEAR_PLANNER_CHOICES);
        return DEAR_ERR_ARG;
    }
    return dear_plan_by_id(plan, prob, which);
}

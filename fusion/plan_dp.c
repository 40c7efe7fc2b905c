/* Planner dp: exact dynamic programmes for one FIFO channel, one per phase (the derivation is
 * in docs/FORMATS.md, "Planners"), and for schedule dear the best split between all-gathers
 * run early, during backward, and in the next forward. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fusion/planner_impl.h"
#include "include/dear_types.h"

/* Group costs already priced, per collective op, for every [lo, hi) with 0 <= lo < hi <= n, row
 * lo holding hi = lo + 1..n in order (NAN: not yet). Why: the search for the split runs the DPs
 * dozens of times over the same groups, and pricing a group through the cost model is most of a
 * DP's time; the DPs walk one row at a time. A table over DP_MEMO_MAX_BYTES is not made: the
 * groups are then priced each time. */
#define DP_MEMO_MAX_BYTES ((size_t)64 << 20)
typedef struct {
    int n;
    double *tab[DEAR_COLL_OP_COUNT];
} dp_memo_t;

/* The cost of one group of tensors [lo, hi) (forward order) in a DP: the collective op on it, as
 * the simulator prices it (sparse runs included); with `early` < n the tensors of the group at or
 * past `early` also pay their all-gather right behind it (an early group aligned with the bucket,
 * as the simulator runs it). Non-decreasing in the group's extent, which is all the DPs' pruning
 * needs. */
typedef struct {
    const dear_sim_cost_t *fn;
    const dear_sim_ws_t *ws;
    dear_coll_op_t op;
    int early;
    const double *prefix;       /* prefix[t]: dense bytes of tensors 0..t-1, for the memory cap */
    int n;
    double *tab_op, *tab_ag;    /* dp_memo_t's tables for op and the all-gather; NULL: none */
} dp_cost_t;

static void dp_memo_free(dp_memo_t *m)
{
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        free(m->tab[op]);
    *m = (dp_memo_t){ 0 };
}

/* One op's table, made on first use; NULL (price each time) when too large or out of memory. */
static double *dp_memo_tab(dp_memo_t *m, dear_coll_op_t op)
{
    if (!m || m->n <= 0)
        return NULL;
    if (!m->tab[op]) {
        size_t cells = (size_t)m->n * ((size_t)m->n + 1) / 2;
        if (cells > DP_MEMO_MAX_BYTES / sizeof(double) || !(m->tab[op] = malloc(cells * sizeof(double)))) {
            m->n = 0;   /* not again */
            return NULL;
        }
        for (size_t k = 0; k < cells; k++)
            m->tab[op][k] = NAN;
    }
    return m->tab[op];
}

static dp_cost_t dp_cost(const dear_plan_problem_t *prob, const dear_sim_ws_t *ws, dear_coll_op_t op, int early,
                         const double *prefix, dp_memo_t *memo)
{
    dp_cost_t c = { .fn = &prob->cost, .ws = ws, .op = op, .early = early, .prefix = prefix,
                    .n = prob->prof->ntensors };
    c.tab_op = dp_memo_tab(memo, op);
    c.tab_ag = c.tab_op ? dp_memo_tab(memo, DEAR_COLL_ALLGATHER) : NULL;
    if (!c.tab_ag)
        c.tab_op = NULL;
    return c;
}

static inline double dp_price(const dp_cost_t *c, double *tab, dear_coll_op_t op, int lo, int hi)
{
    if (!tab)
        return dear_sim_ws_group(c->ws, c->fn, op, lo, hi);
    size_t row = (size_t)lo * (size_t)c->n - (size_t)lo * ((size_t)lo - 1) / 2;
    double *cell = &tab[row + (size_t)(hi - lo - 1)];
    if (isnan(*cell))
        *cell = dear_sim_ws_group(c->ws, c->fn, op, lo, hi);
    return *cell;
}

static double dp_group(const dp_cost_t *c, int lo, int hi)
{
    double t = dp_price(c, c->tab_op, c->op, lo, hi);
    if (hi > c->early)
        t += dp_price(c, c->tab_ag, DEAR_COLL_ALLGATHER, lo > c->early ? lo : c->early, hi);
    return t;
}

/* Bucket DP over tensors 0..n-1 in ready order; ready[t] non-increasing. */
static double dp_rs_core(int n, const double *ready, const dp_cost_t *c, size_t cap, int *first, int *ng)
{
    /* Ready order j = 1..n is tensor n - j. F(j): earliest end of the bucket closing at j;
     * F(j) = min_{i<j} max(F(i), r_j) + cost(bucket (i, j]). F is non-decreasing (dropping
     * the last tensor of a schedule never ends it later), so scanning i downward we can stop at
     * the first i with F(i) <= r_j: smaller i only add bytes; and once r_j + cost alone reaches
     * the best so far. */
    double *F = malloc(sizeof(double) * (size_t)(n + 1));
    int *arg = malloc(sizeof(int) * (size_t)(n + 1));
    if (!F || !arg) {
        free(F);
        free(arg);
        *ng = -1;
        return NAN;
    }
    F[0] = -INFINITY;
    for (int j = 1; j <= n; j++) {
        double rj = ready[n - j], best = INFINITY;
        int bi = j - 1;
        for (int i = j - 1; i >= 0; i--) {
            if (cap > 0 && i < j - 1 && c->prefix[n - i] - c->prefix[n - j] > (double)cap)
                break;   /* smaller i only add bytes */
            double cost = dp_group(c, n - j, n - i);
            if (rj + cost >= best)
                break;   /* every smaller i costs more and starts no earlier than r_j */
            double st = F[i] > rj ? F[i] : rj;
            double v = st + cost;
            if (v < best) {
                best = v;
                bi = i;
            }
            if (F[i] <= rj)
                break;
        }
        F[j] = best;
        arg[j] = bi;
    }
    int k = 0;
    for (int j = n; j > 0; j = arg[j])
        first[k++] = n - j;   /* bucket (arg[j], j] in ready order starts at tensor n - j: ascending */
    first[k] = n;
    *ng = k;
    double opt = F[n];
    free(F);
    free(arg);
    return opt;
}

/* Group DP over tensors 0..n-1 run back to back in forward order; need[t] non-decreasing. */
static double dp_ag_core(int n, const double *need, const dp_cost_t *c, size_t cap, int *first, int *ng)
{
    /* Groups run back to back from time 0 in forward order; group g is first needed by the
     * layer of its first tensor. Lateness of a partition = max_g (end_g - need_first(g)); the
     * forward pass ends at F + max(0, c0 + lateness) when the channel frees at c0. Suffix DP:
     * H(n) = -inf, H(i) = min_{j>i} cost([i, j)) + max(-need_i, H(j)), since the first group
     * [i, j) shifts every later group by its own cost. H is non-increasing (a shorter suffix is
     * never later), so scanning j upward we stop once H(j) <= -need_i, or once the group's
     * cost - need_i alone reaches the best so far. */
    double *H = malloc(sizeof(double) * (size_t)(n + 1));
    int *arg = malloc(sizeof(int) * (size_t)(n + 1));
    if (!H || !arg) {
        free(H);
        free(arg);
        *ng = -1;
        return NAN;
    }
    H[n] = -INFINITY;
    for (int i = n - 1; i >= 0; i--) {
        double best = INFINITY;
        int bj = i + 1;
        for (int j = i + 1; j <= n; j++) {
            if (cap > 0 && j > i + 1 && c->prefix[j] - c->prefix[i] > (double)cap)
                break;   /* larger j only add bytes */
            double cost = dp_group(c, i, j);
            if (cost - need[i] >= best)
                break;   /* every larger j costs more and is late by at least -need_i */
            double late = H[j] > -need[i] ? H[j] : -need[i];
            double v = cost + late;
            if (v < best) {
                best = v;
                bj = j;
            }
            if (H[j] <= -need[i])
                break;
        }
        H[i] = best;
        arg[i] = bj;
    }
    int k = 0;
    for (int i = 0; i < n; i = arg[i])
        first[k++] = i;
    first[k] = n;
    *ng = k;
    double opt = H[0];
    free(H);
    free(arg);
    return opt;
}

static double *prefix_bytes(int n, const size_t *bytes)
{
    double *S = malloc(sizeof(double) * (size_t)(n + 1));
    if (!S)
        return NULL;
    S[0] = 0;
    for (int t = 0; t < n; t++)
        S[t + 1] = S[t] + (double)bytes[t];
    return S;
}

/* Schedule dear with the all-gathers of tensors [m, n) early: the bucket DP with each bucket's
 * early part gathered right behind it, and the group DP over [0, m) for the forward pass; the
 * early groups are the buckets cut at m. ag must hold n + 2 ints. Returns DEAR_OK or NOMEM. */
static int dp_split(const dear_plan_problem_t *prob, const dear_sim_ws_t *ws, dp_memo_t *memo, int m,
                    const double *ready, const double *need, const double *S, int *rs, int *nrs, int *ag, int *nag,
                    int *ne)
{
    int n = prob->prof->ntensors;
    dp_cost_t c = dp_cost(prob, ws, DEAR_COLL_REDUCE_SCATTER, m, S, memo);
    dp_rs_core(n, ready, &c, prob->cap_bytes, rs, nrs);
    if (*nrs < 0)
        return DEAR_ERR_NOMEM;
    int k = 0;
    if (m > 0) {
        dp_cost_t ca = dp_cost(prob, ws, DEAR_COLL_ALLGATHER, m, S, memo);
        dp_ag_core(m, need, &ca, prob->cap_bytes, ag, &k);
        if (k < 0)
            return DEAR_ERR_NOMEM;
    }
    int reg = k;
    if (m < n) {
        ag[k++] = m;
        for (int g = 1; g < *nrs; g++)
            if (rs[g] > m)
                ag[k++] = rs[g];
    }
    ag[k] = n;
    *nag = k;
    *ne = k - reg;
    return DEAR_OK;
}

/* dp; for schedule dear at the given split, or (split < 0) at the best one. */
static int dp_plan(dear_plan_t *plan, const dear_plan_problem_t *prob, int split)
{
    int rc = dear_planner_check(prob);
    if (rc != DEAR_OK)
        return rc;
    int n = prob->prof->ntensors;
    if (prob->no_early && prob->sched == DEAR_SCHED_DEAR && split < 0)
        split = n; /* every all-gather in the forward pass */
    if (split > n || (split >= 0 && prob->sched != DEAR_SCHED_DEAR)) {
        DEAR_ERROR("plan", "dp split %d: needs schedule dear and a split in 0..%d", split, n);
        return DEAR_ERR_ARG;
    }
    if (prob->sched == DEAR_SCHED_SYNC) {
        rc = dear_planner_one(plan, n);
        if (rc == DEAR_OK)
            snprintf(plan->planner, sizeof plan->planner, "dp");
        return rc;
    }
    double *ready, *need;
    size_t *bytes;
    rc = dear_planner_times(prob->prof, &ready, &need, &bytes);
    if (rc != DEAR_OK)
        return rc;
    double *S = prefix_bytes(n, bytes);
    int *rs = malloc(sizeof(int) * (size_t)(n + 1)), *ag = malloc(sizeof(int) * (size_t)(n + 2));
    int *brs = malloc(sizeof(int) * (size_t)(n + 1)), *bag = malloc(sizeof(int) * (size_t)(n + 2));
    dear_sim_ws_t *ws = NULL;
    int nrs = -1, nag = -1, bnrs = 0, bnag = 0, bne = 0;
    if (!S || !rs || !ag || !brs || !bag) {
        rc = DEAR_ERR_NOMEM;
        goto out;
    }
    rc = dear_sim_ws_create(prob->prof, &ws);
    if (rc != DEAR_OK)
        goto out;
    dear_sim_ws_set_shard(ws, prob->shard);
    if (prob->sched == DEAR_SCHED_WFBP) {
        dp_cost_t c = dp_cost(prob, ws, DEAR_COLL_ALLREDUCE, n, S, NULL);
        dp_rs_core(n, ready, &c, prob->cap_bytes, brs, &bnrs);
        if (bnrs < 0) {
            rc = DEAR_ERR_NOMEM;
            goto out;
        }
        memcpy(bag, brs, sizeof(int) * (size_t)(bnrs + 1));
        bnag = bnrs;
    } else if (split >= 0) {
        rc = dp_split(prob, ws, NULL, split, ready, need, S, brs, &bnrs, bag, &bnag, &bne);
    } else {
        /* Each split between all-gathers run early (during backward) and in the next forward
         * pass is solved exactly per phase; the simulator, which couples the phases (the
         * backward tail delays the next forward), picks the split. Splits lie between layers
         * and between the chunks of a cut tensor (whose all-gather may then be spread over
         * both sides).
         * Up to SPLITS_ALL of them are all tried; beyond, every step-th (at most SPLITS_ALL
         * in all), then every one within a step of the best, which keeps planning a
         * 400-tensor model around half a second. m = n (every all-gather in the forward pass)
         * is tried first, so ties keep it. */
        enum { SPLITS_ALL = 160 };
        dp_memo_t memo = { .n = n };
        int *cand = malloc(sizeof(int) * (size_t)(n + 1)), nc = 0;
        if (!cand) {
            rc = DEAR_ERR_NOMEM;
            goto out;
        }
        for (int m = n; m >= 0; m--)
            if (m == 0 || m == n || prob->prof->tensors[m].lidx != prob->prof->tensors[m - 1].lidx ||
                prob->prof->tensors[m].chunk > 0)
                cand[nc++] = m;
        int step = nc > SPLITS_ALL ? (nc + SPLITS_ALL / 2 - 1) / (SPLITS_ALL / 2) : 1;
        double best = INFINITY;
        int bk = 0;
        for (int stage = 0; stage < (step > 1 ? 2 : 1) && rc == DEAR_OK; stage++) {
            int k0 = stage ? (bk - step + 1 > 0 ? bk - step + 1 : 0) : 0;
            int k1 = stage ? (bk + step - 1 < nc - 1 ? bk + step - 1 : nc - 1) : nc - 1;
            for (int k = k0; k <= k1 && rc == DEAR_OK; k++) {
                if ((stage == 0 && k % step && k != nc - 1) || (stage == 1 && k % step == 0))
                    continue;   /* stage 0: every step-th and the last; stage 1: the rest near bk */
                int ne, m = cand[k];
                rc = dp_split(prob, ws, &memo, m, ready, need, S, rs, &nrs, ag, &nag, &ne);
                if (rc != DEAR_OK)
                    break;
                double t = dear_sim_ws_iter(ws, &prob->cost, prob->sched, nrs, rs, nag, ag, ne);
                if (t < best) {
                    best = t;
                    bk = k;
                    memcpy(brs, rs, sizeof(int) * (size_t)(nrs + 1));
                    memcpy(bag, ag, sizeof(int) * (size_t)(nag + 1));
                    bnrs = nrs;
                    bnag = nag;
                    bne = ne;
                }
            }
        }
        free(cand);
        dp_memo_free(&memo);
    }
    if (rc == DEAR_OK)
        rc = dear_plan_set(plan, n, bnrs, brs, bnag, bag, "dp");
    if (rc == DEAR_OK)
        plan->ag_early = bne;
out:
    dear_sim_ws_free(ws);
    free(S);
    free(rs);
    free(ag);
    free(brs);
    free(bag);
    free(ready);
    free(need);
    free(bytes);
    return rc;
}

int dear_plan_dp(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    return dp_plan(plan, prob, -1);
}

int dear_plan_dp_split(dear_plan_t *plan, const dear_plan_problem_t *prob, int m)
{
    if (m < 0) {
        DEAR_ERROR("plan", "dp split %d: needs a split in 0..ntensors", m);
        return DEAR_ERR_ARG;
    }
    return dp_plan(plan, prob, m);
}


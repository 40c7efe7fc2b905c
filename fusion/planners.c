/* The model-driven planners: MG-WFBP, the per-phase exact DPs, GradSSA (sparrow search) and
 * auto. Their models and rules are those of DESIGN.md; planners.h says what each optimises. */
#include "fusion/planners.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "include/dear.h"
#include "runtime/log.h"

int dear_plan_problem_init(dear_plan_problem_t *prob, const dear_profile_t *prof, dear_sim_sched_t sched,
                           const dear_cost_model_t *model, size_t cap_bytes, dear_sim_model_arg_t *marg)
{
    if (!prob || !prof || !model || !marg || (unsigned)sched >= DEAR_SIM_SCHED_COUNT)
        return DEAR_ERR_ARG;
    dear_plan_problem_t p = { .prof = prof, .sched = sched, .threshold = 25u << 20, .seed = 1 };
    for (int op = 0; op < DEAR_COST_NOPS; op++) {
        int rc = dear_cost_linear(model, (dear_cost_op_t)op, &p.alpha[op], &p.beta[op]);
        if (rc != DEAR_OK)
            return rc;
    }
    marg->model = model;
    marg->cap_bytes = cap_bytes;
    p.cap_bytes = cap_bytes;
    p.cost.fn = dear_sim_cost_model;
    p.cost.arg = marg;
    *prob = p;
    return DEAR_OK;
}

/* ---- helpers ---- */

static int plan_one(dear_plan_t *plan, int n)
{
    int first[2] = { 0, n };
    return dear_plan_set(plan, n, 1, first, 1, first, "one");
}

/* Per tensor: ready (after backward start) and need (forward start without stalls) times. */
static int tensor_times(const dear_profile_t *prof, double **ready, double **need, size_t **bytes)
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

static int check_prob(const dear_plan_problem_t *prob)
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

/* ---- MG-WFBP ---- */

int dear_plan_mgwfbp(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    int rc = check_prob(prob);
    if (rc != DEAR_OK)
        return rc;
    int n = prob->prof->ntensors;
    if (prob->sched == DEAR_SIM_SCHED_SYNC) {
        rc = plan_one(plan, n);
        if (rc == DEAR_OK)
            snprintf(plan->planner, sizeof plan->planner, "mgwfbp");
        return rc;
    }
    dear_cost_op_t op = prob->sched == DEAR_SIM_SCHED_WFBP ? DEAR_COST_AR : DEAR_COST_RS;
    double a = prob->alpha[op], b = prob->beta[op];
    double *ready, *need;
    size_t *bytes;
    rc = tensor_times(prob->prof, &ready, &need, &bytes);
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

/* ---- exact DPs ---- */

/* The cost of one group of tensors [lo, hi) (forward order) in a DP: the collective op on its
 * bytes, by the problem's cost function; with `early` < n the tensors of the group at or past
 * `early` also pay their all-gather right behind it (an early group aligned with the bucket, as
 * the simulator runs it). Non-decreasing in the group's extent, which is all the DPs' pruning
 * needs. */
typedef struct {
    const dear_sim_cost_t *fn;
    dear_cost_op_t op;
    int early;
    const double *prefix;       /* prefix[t]: bytes of tensors 0..t-1 */
} dp_cost_t;

static double dp_group(const dp_cost_t *c, int lo, int hi)
{
    double t = c->fn->fn(c->fn->arg, c->op, (size_t)(c->prefix[hi] - c->prefix[lo]));
    if (hi > c->early)
        t += c->fn->fn(c->fn->arg, DEAR_COST_AG, (size_t)(c->prefix[hi] - c->prefix[lo > c->early ? lo : c->early]));
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
static int dp_split(const dear_plan_problem_t *prob, int m, const double *ready, const double *need, const double *S,
                    int *rs, int *nrs, int *ag, int *nag, int *ne)
{
    int n = prob->prof->ntensors;
    dp_cost_t c = { .fn = &prob->cost, .op = DEAR_COST_RS, .early = m, .prefix = S };
    dp_rs_core(n, ready, &c, prob->cap_bytes, rs, nrs);
    if (*nrs < 0)
        return DEAR_ERR_NOMEM;
    int k = 0;
    if (m > 0) {
        dp_cost_t ca = { .fn = &prob->cost, .op = DEAR_COST_AG, .early = m, .prefix = S };
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
    int rc = check_prob(prob);
    if (rc != DEAR_OK)
        return rc;
    int n = prob->prof->ntensors;
    if (split > n || (split >= 0 && prob->sched != DEAR_SIM_SCHED_DEAR)) {
        DEAR_ERROR("plan", "dp split %d: needs schedule dear and a split in 0..%d", split, n);
        return DEAR_ERR_ARG;
    }
    if (prob->sched == DEAR_SIM_SCHED_SYNC) {
        rc = plan_one(plan, n);
        if (rc == DEAR_OK)
            snprintf(plan->planner, sizeof plan->planner, "dp");
        return rc;
    }
    double *ready, *need;
    size_t *bytes;
    rc = tensor_times(prob->prof, &ready, &need, &bytes);
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
    if (prob->sched == DEAR_SIM_SCHED_WFBP) {
        dp_cost_t c = { .fn = &prob->cost, .op = DEAR_COST_AR, .early = n, .prefix = S };
        dp_rs_core(n, ready, &c, prob->cap_bytes, brs, &bnrs);
        if (bnrs < 0) {
            rc = DEAR_ERR_NOMEM;
            goto out;
        }
        memcpy(bag, brs, sizeof(int) * (size_t)(bnrs + 1));
        bnag = bnrs;
    } else if (split >= 0) {
        rc = dp_split(prob, split, ready, need, S, brs, &bnrs, bag, &bnag, &bne);
    } else {
        /* Each split between all-gathers run early (during backward) and in the next forward
         * pass is solved exactly per phase; the simulator, which couples the phases (the
         * backward tail delays the next forward), picks the split. Splits lie between layers.
         * Up to SPLITS_ALL of them are all tried; beyond, every step-th (at most SPLITS_ALL
         * in all), then every one within a step of the best, which keeps planning a
         * 400-tensor model around half a second. m = n (every all-gather in the forward pass)
         * is tried first, so ties keep it. */
        enum { SPLITS_ALL = 160 };
        rc = dear_sim_ws_create(prob->prof, &ws);
        if (rc != DEAR_OK)
            goto out;
        int *cand = malloc(sizeof(int) * (size_t)(n + 1)), nc = 0;
        if (!cand) {
            rc = DEAR_ERR_NOMEM;
            goto out;
        }
        for (int m = n; m >= 0; m--)
            if (m == 0 || m == n || prob->prof->tensors[m].lidx != prob->prof->tensors[m - 1].lidx)
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
                rc = dp_split(prob, m, ready, need, S, rs, &nrs, ag, &nag, &ne);
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

/* ---- GradSSA ---- */

typedef struct {
    uint64_t s[4];
} rng_t;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void rng_seed(rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static uint64_t rng_next(rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

/* Uniform in [0, 1). */
static double rng_unif(rng_t *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static double rng_normal(rng_t *r)
{
    double u1 = 1.0 - rng_unif(r), u2 = rng_unif(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

typedef struct {
    dear_sim_ws_t *ws;
    const dear_plan_problem_t *prob;
    int n, d1, dims;
    int *rs, *ag;   /* scratch boundaries */
} ssa_eval_t;

static int decode(const double *x, int d1, int n, int *first)
{
    int k = 0;
    first[k++] = 0;
    for (int l = 0; l < d1; l++)
        if (!(x[l] > 0.5))
            first[k++] = l + 1;
    first[k] = n;
    return k;
}

/* Schedule dear's last coordinate: the share of all-gather groups that run early. */
static int decode_early(double x, int nag)
{
    int ne = (int)(x * (nag + 1));
    return ne < 0 ? 0 : ne > nag ? nag : ne;
}

static double ssa_fitness(ssa_eval_t *e, const double *x)
{
    int nrs = decode(x, e->d1, e->n, e->rs);
    int nag = nrs, ne = 0;
    const int *ag = e->rs;
    if (e->prob->sched == DEAR_SIM_SCHED_DEAR) {
        nag = decode(x + e->d1, e->d1, e->n, e->ag);
        ag = e->ag;
        ne = decode_early(x[2 * e->d1], nag);
    }
    return dear_sim_ws_iter(e->ws, &e->prob->cost, e->prob->sched, nrs, e->rs, nag, ag, ne);
}

/* The coordinate that decodes to ne early groups of nag (the middle of its interval). */
static double encode_early(int ne, int nag)
{
    return (ne + 0.5) / (nag + 1);
}

static void encode_partition(const dear_partition_t *p, double *x, int d1)
{
    for (int l = 0; l < d1; l++)
        x[l] = 1.0;
    for (int g = 1; g < p->ngroups; g++)
        x[p->first[g] - 1] = 0.0;
}

static int by_fitness(const void *a, const void *b, void *arg)
{
    const double *fit = arg;
    int i = *(const int *)a, j = *(const int *)b;
    if (fit[i] < fit[j])
        return -1;
    if (fit[i] > fit[j])
        return 1;
    return (i > j) - (i < j);   /* ties by index: the order is deterministic */
}

static void sort_idx(int *idx, int n, double *fit)
{
    for (int i = 0; i < n; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)n, sizeof(int), by_fitness, fit);
}

/* Seeds of the search: WFBP (one bucket per layer), sync (one bucket), MG-WFBP, DP, threshold. */
enum { SSA_NSEEDS = 5 };

static int gradssa_seeds(const dear_plan_problem_t *prob, dear_plan_t seeds[SSA_NSEEDS])
{
    int n = prob->prof->ntensors;
    dear_tensor_desc_t *descs;
    int rc = dear_prof_descs(prob->prof, &descs);
    if (rc != DEAR_OK)
        return rc;
    rc = dear_plan_none(&seeds[0], n, descs);
    if (rc == DEAR_OK)
        rc = dear_plan_threshold(&seeds[4], n, descs, prob->threshold ? prob->threshold : 1);
    free(descs);
    if (rc == DEAR_OK)
        rc = plan_one(&seeds[1], n);
    if (rc == DEAR_OK)
        rc = dear_plan_mgwfbp(&seeds[2], prob);
    if (rc == DEAR_OK)
        rc = dear_plan_dp(&seeds[3], prob);
    return rc;
}

/* The search itself from given seeds (read only; auto passes the plans it already made). */
static int gradssa_run(dear_plan_t *plan, const dear_plan_problem_t *prob, const dear_plan_t seeds[SSA_NSEEDS]);

int dear_plan_gradssa(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    int rc = check_prob(prob);
    if (rc != DEAR_OK)
        return rc;
    int n = prob->prof->ntensors;
    if (prob->sched == DEAR_SIM_SCHED_SYNC || n == 1) {
        rc = plan_one(plan, n);
        if (rc == DEAR_OK)
            snprintf(plan->planner, sizeof plan->planner, "gradssa");
        return rc;
    }
    dear_plan_t seeds[SSA_NSEEDS];
    memset(seeds, 0, sizeof seeds);
    rc = gradssa_seeds(prob, seeds);
    if (rc == DEAR_OK)
        rc = gradssa_run(plan, prob, seeds);
    for (int i = 0; i < SSA_NSEEDS; i++)
        dear_plan_free(&seeds[i]);
    return rc;
}

static int gradssa_run(dear_plan_t *plan, const dear_plan_problem_t *prob, const dear_plan_t seeds[SSA_NSEEDS])
{
    int rc = DEAR_OK, n = prob->prof->ntensors;
    const double ST = 0.8, PD = 0.2, SD = 0.1;
    int N = prob->population > 0 ? prob->population : 100;
    int T = prob->rounds > 0 ? prob->rounds : 100;
    if (N < SSA_NSEEDS + 1)
        N = SSA_NSEEDS + 1;   /* room for the seeds and one random sparrow */
    ssa_eval_t e = { .prob = prob, .n = n, .d1 = n - 1 };
    e.dims = prob->sched == DEAR_SIM_SCHED_DEAR ? 2 * e.d1 + 1 : e.d1;
    int dims = e.dims;
    double *pos = NULL, *fit = NULL, *gbest = NULL, *xp = NULL, *xw = NULL;
    int *idx = NULL, *perm = NULL;
    char *dirty = NULL;
    rc = dear_sim_ws_create(prob->prof, &e.ws);
    if (rc != DEAR_OK)
        return rc;
    pos = malloc(sizeof(double) * (size_t)N * (size_t)dims);
    fit = malloc(sizeof(double) * (size_t)N);
    gbest = malloc(sizeof(double) * (size_t)dims);
    xp = malloc(sizeof(double) * (size_t)dims);
    xw = malloc(sizeof(double) * (size_t)dims);
    idx = malloc(sizeof(int) * (size_t)N);
    perm = malloc(sizeof(int) * (size_t)N);
    dirty = malloc((size_t)N);
    e.rs = malloc(sizeof(int) * (size_t)(n + 1));
    e.ag = malloc(sizeof(int) * (size_t)(n + 1));
    if (!pos || !fit || !gbest || !xp || !xw || !idx || !perm || !dirty || !e.rs || !e.ag) {
        rc = DEAR_ERR_NOMEM;
        goto out;
    }
    rng_t rng;
    rng_seed(&rng, prob->seed);
    for (int s = 0; s < N; s++) {
        double *x = pos + (size_t)s * dims;
        if (s < SSA_NSEEDS) {
            encode_partition(&seeds[s].rs, x, e.d1);
            if (dims > e.d1) {
                /* dear: the seed's partitions with their best number of early groups. */
                encode_partition(&seeds[s].ag, x + e.d1, e.d1);
                double bt = INFINITY;
                for (int ne = 0; ne <= seeds[s].ag.ngroups; ne++) {
                    x[2 * e.d1] = encode_early(ne, seeds[s].ag.ngroups);
                    double t = ssa_fitness(&e, x);
                    if (t < bt) {
                        bt = t;
                        fit[s] = encode_early(ne, seeds[s].ag.ngroups); /* scratch: best coordinate */
                    }
                }
                x[2 * e.d1] = fit[s];
            }
        } else {
            for (int k = 0; k < dims; k++)
                x[k] = rng_unif(&rng);
        }
        fit[s] = ssa_fitness(&e, x);
    }
    int bi = 0;
    for (int s = 1; s < N; s++)
        if (fit[s] < fit[bi])
            bi = s;
    double fbest = fit[bi];
    memcpy(gbest, pos + (size_t)bi * dims, sizeof(double) * (size_t)dims);

    int pnum = (int)(PD * N + 0.5), snum = (int)(SD * N + 0.5);
    if (pnum < 1)
        pnum = 1;
    if (snum < 1)
        snum = 1;
    for (int round = 1; round <= T; round++) {
        sort_idx(idx, N, fit);
        double f_round_best = fit[idx[0]], fw = fit[idx[N - 1]];
        memcpy(xw, pos + (size_t)idx[N - 1] * dims, sizeof(double) * (size_t)dims);
        memset(dirty, 0, (size_t)N);
        /* Producers: shrink towards 0 while no alarm, else take a random step. */
        double r2 = rng_unif(&rng);
        for (int i = 1; i <= pnum; i++) {
            double *x = pos + (size_t)idx[i - 1] * dims;
            if (r2 < ST) {
                double al = 1.0 - rng_unif(&rng);   /* (0, 1] */
                double f = exp(-(double)i / (al * T));
                for (int k = 0; k < dims; k++)
                    x[k] *= f;
            } else {
                double q = rng_normal(&rng);
                for (int k = 0; k < dims; k++)
                    x[k] += q;
            }
            for (int k = 0; k < dims; k++)
                x[k] = x[k] < 0 ? 0 : x[k] > 1 ? 1 : x[k];
            fit[idx[i - 1]] = ssa_fitness(&e, x);
        }
        /* x_P: the best producer position after the producers moved. */
        int bp = idx[0];
        for (int i = 2; i <= pnum; i++)
            if (fit[idx[i - 1]] < fit[bp])
                bp = idx[i - 1];
        memcpy(xp, pos + (size_t)bp * dims, sizeof(double) * (size_t)dims);
        /* Scroungers: the hungry half flies off, the rest feed next to the best producer. */
        for (int i = pnum + 1; i <= N; i++) {
            double *x = pos + (size_t)idx[i - 1] * dims;
            dirty[idx[i - 1]] = 1;
            if (i > N / 2) {
                double q = rng_normal(&rng), ii = (double)i * i;
                for (int k = 0; k < dims; k++)
                    x[k] = q * exp((xw[k] - x[k]) / ii);
            } else {
                /* x_P + |x - x_P| A+ 1, A a random +-1 row, A+ = A^T (A A^T)^-1 = A^T / dims. */
                double sc = 0;
                for (int k = 0; k < dims; k++)
                    sc += fabs(x[k] - xp[k]) * ((rng_next(&rng) >> 63) ? 1.0 : -1.0);
                sc /= dims;
                for (int k = 0; k < dims; k++)
                    x[k] = xp[k] + sc;
            }
        }
        /* Danger-aware sparrows: SD*N picked at random (partial Fisher-Yates). */
        for (int i = 0; i < N; i++)
            perm[i] = i;
        for (int i = 0; i < snum && i < N; i++) {
            int j = i + (int)(rng_unif(&rng) * (N - i));
            int t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
            int s = perm[i];
            double *x = pos + (size_t)s * dims;
            dirty[s] = 1;
            if (fit[s] > f_round_best) {
                double be = rng_normal(&rng);
                for (int k = 0; k < dims; k++)
                    x[k] = gbest[k] + be * fabs(x[k] - gbest[k]);
            } else {
                double K = 2 * rng_unif(&rng) - 1, den = fit[s] - fw + 1e-50;
                for (int k = 0; k < dims; k++)
                    x[k] += K * fabs(x[k] - xw[k]) / den;
            }
        }
        for (int s = 0; s < N; s++) {
            if (!dirty[s])
                continue;
            double *x = pos + (size_t)s * dims;
            for (int k = 0; k < dims; k++)
                x[k] = isnan(x[k]) ? 0.5 : x[k] < 0 ? 0 : x[k] > 1 ? 1 : x[k];
            fit[s] = ssa_fitness(&e, x);
        }
        for (int s = 0; s < N; s++)
            if (fit[s] < fbest) {
                fbest = fit[s];
                memcpy(gbest, pos + (size_t)s * dims, sizeof(double) * (size_t)dims);
            }
    }
    {
        int nrs = decode(gbest, e.d1, n, e.rs), nag = nrs, ne = 0;
        int *ag = e.rs;
        if (dims > e.d1) {
            nag = decode(gbest + e.d1, e.d1, n, e.ag);
            ag = e.ag;
            ne = decode_early(gbest[2 * e.d1], nag);
        }
        rc = dear_plan_set(plan, n, nrs, e.rs, nag, ag, "gradssa");
        if (rc == DEAR_OK)
            plan->ag_early = ne;
    }
out:
    dear_sim_ws_free(e.ws);
    free(pos);
    free(fit);
    free(gbest);
    free(xp);
    free(xw);
    free(idx);
    free(perm);
    free(dirty);
    free(e.rs);
    free(e.ag);
    return rc;
}

/* ---- auto and by name ---- */

const char *dear_plan_names(void)
{
    return "none|threshold|mgwfbp|dp|gradssa|auto";
}

static int plan_simple(dear_plan_t *plan, const dear_plan_problem_t *prob, int threshold)
{
    dear_tensor_desc_t *descs;
    int rc = check_prob(prob);
    if (rc != DEAR_OK)
        return rc;
    rc = dear_prof_descs(prob->prof, &descs);
    if (rc != DEAR_OK)
        return rc;
    if (threshold)
        rc = dear_plan_threshold(plan, prob->prof->ntensors, descs, prob->threshold ? prob->threshold : 1);
    else
        rc = dear_plan_none(plan, prob->prof->ntensors, descs);
    free(descs);
    return rc;
}

static double sim_iter(const dear_plan_problem_t *prob, const dear_plan_t *plan, int *rc)
{
    dear_sim_result_t r = { 0 };
    *rc = dear_sim_run(prob->prof, &prob->cost, prob->sched, plan, 0, &r);
    return *rc == DEAR_OK ? r.iter_s : INFINITY;
}

int dear_plan_auto(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    int rc = check_prob(prob);
    if (rc != DEAR_OK)
        return rc;
    static const char *const cands[] = { "none", "threshold", "mgwfbp", "dp", "gradssa" };
    enum { NC = (int)(sizeof cands / sizeof cands[0]) };
    dear_plan_t p[NC];
    memset(p, 0, sizeof p);
    for (int c = 0; c < NC - 1 && rc == DEAR_OK; c++)
        rc = dear_plan_by_name(&p[c], prob, cands[c]);
    /* GradSSA from the plans just made (the same seeds it would make itself). */
    if (rc == DEAR_OK && (prob->sched == DEAR_SIM_SCHED_SYNC || prob->prof->ntensors == 1)) {
        rc = dear_plan_gradssa(&p[NC - 1], prob);
    } else if (rc == DEAR_OK) {
        dear_plan_t one = { 0 };
        rc = plan_one(&one, prob->prof->ntensors);
        if (rc == DEAR_OK) {
            const dear_plan_t seeds[SSA_NSEEDS] = { p[0], one, p[2], p[3], p[1] };
            rc = gradssa_run(&p[NC - 1], prob, seeds);
        }
        dear_plan_free(&one);
    }
    /* Schedule dear has two independent phases: every pair (reduce-scatter buckets of one
     * planner, all-gather groups of another) is simulated. The others only have buckets. */
    int nag = prob->sched == DEAR_SIM_SCHED_DEAR ? NC : 1, bi = 0, bj = 0, be = 0;
    double best = INFINITY;
    for (int i = 0; i < NC && rc == DEAR_OK; i++)
        for (int j = 0; j < nag && rc == DEAR_OK; j++) {
            int k = nag > 1 ? j : i;
            /* dear: also every number of early all-gather groups (0 = all in the forward). */
            int emax = nag > 1 ? p[k].ag.ngroups : 0;
            for (int ne = 0; ne <= emax && rc == DEAR_OK; ne++) {
                dear_plan_t mix = { .ntensors = p[i].ntensors, .rs = p[i].rs, .ag = p[k].ag, .ag_early = ne };
                double t = sim_iter(prob, &mix, &rc);
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
        res.ntensors = p[bi].ntensors;
        rc = dear_partition_set(&res.rs, res.ntensors, p[bi].rs.ngroups, p[bi].rs.first);
    }
    if (rc == DEAR_OK)
        rc = dear_partition_set(&res.ag, res.ntensors, p[bj].ag.ngroups, p[bj].ag.first);
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

int dear_plan_by_name(dear_plan_t *plan, const dear_plan_problem_t *prob, const char *name)
{
    if (!name)
        return DEAR_ERR_ARG;
    if (strcmp(name, "none") == 0)
        return plan_simple(plan, prob, 0);
    if (strcmp(name, "threshold") == 0)
        return plan_simple(plan, prob, 1);
    if (strcmp(name, "one") == 0)
        return check_prob(prob) == DEAR_OK ? plan_one(plan, prob->prof->ntensors) : DEAR_ERR_ARG;
    if (strcmp(name, "mgwfbp") == 0)
        return dear_plan_mgwfbp(plan, prob);
    if (strcmp(name, "dp") == 0)
        return dear_plan_dp(plan, prob);
    if (strcmp(name, "gradssa") == 0)
        return dear_plan_gradssa(plan, prob);
    if (strcmp(name, "auto") == 0)
        return dear_plan_auto(plan, prob);
    DEAR_ERROR("plan", "unknown planner '%s' (accepted: %s)", name, dear_plan_names());
    return DEAR_ERR_ARG;
}

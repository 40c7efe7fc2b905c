/* Planner gradssa: sparrow search (Xue & Shen 2020) over fusion vectors per phase, the
 * simulator's iteration time as fitness, seeded with the other planners' plans. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fusion/planner_impl.h"
#include "include/dear_types.h"

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
    if (e->prob->sched == DEAR_SCHED_DEAR) {
        nag = decode(x + e->d1, e->d1, e->n, e->ag);
        ag = e->ag;
        ne = e->prob->no_early ? 0 : decode_early(x[2 * e->d1], nag);
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
static int gradssa_seeds(const dear_plan_problem_t *prob, dear_plan_t seeds[DEAR_SSA_NSEEDS])
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
        rc = dear_planner_one(&seeds[1], n);
    if (rc == DEAR_OK)
        rc = dear_plan_mgwfbp(&seeds[2], prob);
    if (rc == DEAR_OK)
        rc = dear_plan_dp(&seeds[3], prob);
    return rc;
}

int dear_plan_gradssa(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    int rc = dear_planner_check(prob);
    if (rc != DEAR_OK)
        return rc;
    int n = prob->prof->ntensors;
    if (prob->sched == DEAR_SCHED_SYNC || n == 1) {
        rc = dear_planner_one(plan, n);
        if (rc == DEAR_OK)
            snprintf(plan->planner, sizeof plan->planner, "gradssa");
        return rc;
    }
    dear_plan_t seeds[DEAR_SSA_NSEEDS];
    memset(seeds, 0, sizeof seeds);
    rc = gradssa_seeds(prob, seeds);
    if (rc == DEAR_OK)
        rc = dear_plan_gradssa_seeded(plan, prob, seeds);
    for (int i = 0; i < DEAR_SSA_NSEEDS; i++)
        dear_plan_free(&seeds[i]);
    return rc;
}

int dear_plan_gradssa_seeded(dear_plan_t *plan, const dear_plan_problem_t *prob, const dear_plan_t seeds[DEAR_SSA_NSEEDS])
{
    int rc = DEAR_OK, n = prob->prof->ntensors;
    const double ST = 0.8, PD = 0.2, SD = 0.1;
    int N = prob->population > 0 ? prob->population : 100;
    int T = prob->rounds > 0 ? prob->rounds : 100;
    if (N < DEAR_SSA_NSEEDS + 1)
        N = DEAR_SSA_NSEEDS + 1;   /* room for the seeds and one random sparrow */
    ssa_eval_t e = { .prob = prob, .n = n, .d1 = n - 1 };
    e.dims = prob->sched == DEAR_SCHED_DEAR ? 2 * e.d1 + 1 : e.d1;
    int dims = e.dims;
    double *pos = NULL, *fit = NULL, *gbest = NULL, *xp = NULL, *xw = NULL;
    int *idx = NULL, *perm = NULL;
    char *dirty = NULL;
    rc = dear_sim_ws_create(prob->prof, &e.ws);
    if (rc != DEAR_OK)
        return rc;
    dear_sim_ws_set_shard(e.ws, prob->shard);
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
        if (s < DEAR_SSA_NSEEDS) {
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
            ne = prob->no_early ? 0 : decode_early(gbest[2 * e.d1], nag);
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


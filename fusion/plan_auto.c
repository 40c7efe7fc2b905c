/* Planner auto: the lowest predicted iteration time of every candidate planner's plan; for
 * schedule dear per phase (one planner's buckets with another's all-gather groups) and with the
 * best number of early all-gather groups. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "fusion/planner_impl.h"
#include "include/dear_types.h"

/* The candidates' plans (the planners of the table flagged DEAR_PLANNER_F_CANDIDATE, in its
 * order: ties keep the earlier) into p[0..*nc). gradssa would make the others' plans again as its
 * seeds, so it is made last, from them. */
static int candidates(const dear_plan_problem_t *prob, dear_plan_t *p, int *nc)
{
    dear_planner_t cand[DEAR_PLANNER_COUNT];
    int NC = 0, ssa = -1, at[DEAR_PLANNER_COUNT], rc = DEAR_OK;
    for (int k = 0; k < DEAR_PLANNER_COUNT; k++) {
        at[k] = -1;
        if (dear_planner_flags((dear_planner_t)k) & DEAR_PLANNER_F_CANDIDATE) {
            at[k] = NC;
            cand[NC++] = (dear_planner_t)k;
        }
    }
    *nc = NC;
    ssa = at[DEAR_PLANNER_GRADSSA];
    for (int c = 0; c < NC && rc == DEAR_OK; c++)
        if (c != ssa)
            rc = dear_plan_by_id(&p[c], prob, cand[c]);
    int seeded = at[DEAR_PLANNER_NONE] >= 0 && at[DEAR_PLANNER_MGWFBP] >= 0 && at[DEAR_PLANNER_DP] >= 0 &&
                 at[DEAR_PLANNER_THRESHOLD] >= 0;
    if (rc == DEAR_OK && ssa >= 0 &&
        (!seeded || prob->sched == DEAR_SCHED_SYNC || prob->prof->ntensors == 1)) {
        rc = dear_plan_gradssa(&p[ssa], prob);
    } else if (rc == DEAR_OK && ssa >= 0) {
        dear_plan_t one = { 0 };
        rc = dear_planner_one(&one, prob->prof->ntensors);
        if (rc == DEAR_OK) {
            const dear_plan_t seeds[DEAR_SSA_NSEEDS] = { p[at[DEAR_PLANNER_NONE]], one, p[at[DEAR_PLANNER_MGWFBP]],
                                                         p[at[DEAR_PLANNER_DP]], p[at[DEAR_PLANNER_THRESHOLD]] };
            rc = dear_plan_gradssa_seeded(&p[ssa], prob, seeds);
        }
        dear_plan_free(&one);
    }
    return rc;
}

/* The collectives a plan of rs's buckets and ag's groups starts per iteration. Between equal
 * predictions auto takes the fewest: the model is least sure of a collective's start-up and of
 * many in flight, so the plan with fewer leaves the least to its error (where the reduce-scatters
 * hide under backward, every bucketing predicts the same iteration). */
static int collectives(const dear_plan_problem_t *prob, const dear_plan_t *rs, const dear_plan_t *ag)
{
    return rs->rs.ngroups + (prob->sched == DEAR_SCHED_DEAR ? ag->ag.ngroups : 0);
}

/* The buckets of rs with the all-gather groups of ag, with the best trailing run of early groups
 * (schedule dear; 0 = all in the forward) into *ne, equal ones to the fewest: its prediction
 * (INFINITY on failure, in *rc). */
static double pairing(const dear_plan_problem_t *prob, const dear_plan_t *rs, const dear_plan_t *ag, int *ne, int *rc)
{
    double best = INFINITY;
    int emax = prob->sched == DEAR_SCHED_DEAR && !prob->no_early ? ag->ag.ngroups : 0;
    *ne = 0;
    for (int e = 0; e <= emax && *rc == DEAR_OK; e++) {
        dear_plan_t mix = { .nunits = rs->nunits, .ntensors = rs->ntensors, .rs = rs->rs, .ag = ag->ag, .ag_early = e };
        double t = dear_planner_predict(prob, &mix, rc);
        if (*rc == DEAR_OK && t < best)
            best = t, *ne = e;
    }
    return *rc == DEAR_OK ? best : INFINITY;
}

/* The best all-gather side for the buckets of plan rs (schedule dear: any candidate's groups
 * other than avoid's (NULL: none), with every number of early groups, 0 = all in the forward; the
 * others have buckets only): the index of the candidate whose groups it takes in *bj, the early
 * count in *be, the predicted iteration returned (INFINITY on failure, in *rc, or when every
 * grouping is avoid's). */
static double best_pairing(const dear_plan_problem_t *prob, const dear_plan_t *rs, const dear_plan_t *p, int nc,
                           int self, const dear_partition_t *avoid, int *bj, int *be, int *rc)
{
    int nag = prob->sched == DEAR_SCHED_DEAR ? nc : 1;
    double best = INFINITY;
    *bj = self;
    *be = 0;
    for (int j = 0; j < nag && *rc == DEAR_OK; j++) {
        int k = nag > 1 ? j : self;
        if (nag > 1 && avoid && dear_partition_equal(&p[k].ag, avoid))
            continue;
        int ne = 0;
        double t = pairing(prob, rs, &p[k], &ne, rc);
        /* An equal prediction goes to fewer collectives, then to the earlier, simpler choice. */
        if (t < best || (t == best && collectives(prob, rs, &p[k]) < collectives(prob, rs, &p[*bj]))) {
            best = t;
            *bj = k;
            *be = ne;
        }
    }
    return best;
}

/* *out: rs's buckets with the all-gather groups of ag (early groups ne), named name. */
static int compose(dear_plan_t *out, const dear_plan_t *rs, const dear_plan_t *ag, int ne, const char *name)
{
    dear_plan_t res = { 0 };
    res.nunits = res.ntensors = rs->nunits;
    int rc = dear_partition_set(&res.rs, res.nunits, rs->rs.ngroups, rs->rs.first);
    if (rc == DEAR_OK)
        rc = dear_partition_set(&res.ag, res.nunits, ag->ag.ngroups, ag->ag.first);
    if (rc == DEAR_OK) {
        res.ag_early = ne;
        snprintf(res.planner, sizeof res.planner, "%s", name);
        dear_plan_free(out);
        *out = res;
    } else {
        dear_plan_free(&res);
    }
    return rc;
}

/* refine_early tries moves until a pass over the all-gather groups makes none or its
 * simulations have cost AUTO_EARLY_WORK, counted as buckets plus groups per simulation (what one
 * costs): a tenth of what gradssa's 100 sparrows over 100 rounds spend on a plan of that size. A
 * move must gain more than AUTO_EARLY_GAIN of the iteration: the simulator's fixed point is
 * iterated to 1e-12, and moves on its rounding would spend the budget. */
#define AUTO_EARLY_WORK (1L << 20)
#define AUTO_EARLY_GAIN 1e-9

/* Refines which of plan's all-gather groups run early (schedule dear; plan predicted at *pred):
 * each group, last first, moves into or out of backward where the simulator predicts the
 * iteration faster, pass after pass. The candidates offer only a trailing run of early
 * groups, which can move the last layers' all-gathers alone; where backward leaves the link idle
 * once the first layers' buckets are reduced, their groups run there and the next forward waits
 * less. A tie keeps the plan, and no move adds a collective. */
static int refine_early(dear_plan_t *plan, const dear_plan_problem_t *prob, double *pred)
{
    int ng = plan->ag.ngroups, moved = 0, rc = DEAR_OK;
    if (prob->sched != DEAR_SCHED_DEAR || prob->no_early || ng < 2)
        return DEAR_OK;
    dear_sim_ws_t *ws = NULL;
    unsigned char *em = malloc((size_t)ng);
    rc = em ? dear_sim_ws_create(prob->prof, &ws) : DEAR_ERR_NOMEM;
    if (rc != DEAR_OK) {
        free(em);
        return rc;
    }
    dear_sim_ws_set_shard(ws, prob->shard);
    for (int g = 0; g < ng; g++)
        em[g] = (unsigned char)dear_plan_is_early(plan, g);
    double best = dear_sim_ws_iter_early(ws, &prob->cost, prob->sched, plan->rs.ngroups, plan->rs.first, ng,
                                         plan->ag.first, 0, em);
    double from = best;
    long sims = AUTO_EARLY_WORK / (plan->rs.ngroups + ng);
    for (int more = 1; more && sims > 0;) {
        more = 0;
        for (int k = 0; k < ng && sims > 0; k++, sims--) {
            int g = ng - 1 - k; /* last first: behind the bucket that completes it, a group moved early
                                 * shifts only what follows in backward */
            em[g] ^= 1;
            double t = dear_sim_ws_iter_early(ws, &prob->cost, prob->sched, plan->rs.ngroups, plan->rs.first, ng,
                                              plan->ag.first, 0, em);
            if (t < best * (1 - AUTO_EARLY_GAIN)) {
                best = t;
                more = 1;
                moved++;
            } else {
                em[g] ^= 1;
            }
        }
    }
    if (moved > 0 && best < *pred) {
        rc = dear_plan_set_early(plan, em);
        if (rc == DEAR_OK) {
            DEAR_DEBUG("plan", "auto: %d move(s) of all-gather groups into or out of backward: %d early, predicted "
                               "%.3f ms (%.3f ms with the trailing run)",
                       moved, plan->ag_early, 1e3 * best, 1e3 * from);
            *pred = best;
        }
    }
    free(em);
    dear_sim_ws_free(ws);
    return rc;
}

/* Another refined pairing must predict more than this share of the iteration faster than the
 * base (the fastest trailing pairing, refined) to replace it: the model knows least of start-ups,
 * of many collectives in flight and of all-gathers beside reduce-scatters in backward, and
 * pairings predicted under 1% faster ran slower. */
#define AUTO_PAIR_GAIN 0.01

/* The rs buckets of p[i] with the all-gather groups of p[j] from the trailing run ne, named and
 * refined by refine_early into *out, its prediction (from t) into *tout. */
static int refined(dear_plan_t *out, const dear_plan_problem_t *prob, const dear_plan_t *p, int i, int j, int ne,
                   double t, double *tout)
{
    char name[sizeof out->planner];
    if (i == j)
        snprintf(name, sizeof name, "auto:%.26s", p[i].planner);
    else
        snprintf(name, sizeof name, "auto:%.12s+%.12s", p[i].planner, p[j].planner);
    *tout = t;
    int rc = compose(out, &p[i], &p[j], ne, name);
    if (rc == DEAR_OK)
        rc = refine_early(out, prob, tout);
    if (rc == DEAR_OK && *tout < t)
        DEAR_DEBUG("plan", "auto: %s refined: %d early, predicted %.3f ms (%.3f ms before)", name, out->ag_early,
                   1e3 * *tout, 1e3 * t);
    return rc;
}

/* auto's plan into *plan. The base is the fastest pairing with a trailing run of early groups
 * (t[i], bj[i], be[i] of each candidate bucketing i; equal ones to the fewest collectives, then
 * the earlier), refined by refine_early. Under schedule dear every other pair of a candidate's
 * buckets and a candidate's all-gather groups, from its best trailing run, is refined too, and
 * the fastest replaces the base where it predicts more than AUTO_PAIR_GAIN faster. Why every
 * pair: a trailing run suits few large groups, so with any start-up the coarse pairs win before
 * refining, while fine groups, once any of them may run early, can carry the first layers'
 * all-gathers in backward's idle link. *bi gets the chosen bucketing, bj[*bi] and be[*bi] its
 * all-gather side, t[*bi] its refined prediction and *tpre its prediction before refining. */
static int refine_all(dear_plan_t *plan, const dear_plan_problem_t *prob, const dear_plan_t *p, int nc, double *t,
                      int *bj, int *be, int *bi, double *tpre, int rc)
{
    if (rc != DEAR_OK || nc < 1)
        return rc != DEAR_OK ? rc : DEAR_ERR_INTERNAL;
    int b0 = 0;
    for (int i = 1; i < nc; i++)
        if (t[i] < t[b0] || (t[i] == t[b0] && collectives(prob, &p[i], &p[bj[i]]) <
                                                  collectives(prob, &p[b0], &p[bj[b0]])))
            b0 = i;
    dear_plan_t cur = { 0 }, won = { 0 };
    double tbase = INFINITY, best;
    rc = refined(&won, prob, p, b0, bj[b0], be[b0], t[b0], &tbase);
    best = tbase;
    int wi = b0, wj = bj[b0], we = be[b0];
    *tpre = t[b0];
    for (int i = 0; prob->sched == DEAR_SCHED_DEAR && !prob->no_early && i < nc && rc == DEAR_OK; i++) {
        int dup = 0;
        for (int k = 0; k < i && !dup; k++)
            dup = dear_partition_equal(&p[k].rs, &p[i].rs);
        for (int j = 0; !dup && j < nc && rc == DEAR_OK; j++) {
            int dj = i == b0 && j == bj[b0];
            for (int k = 0; k < j && !dj; k++)
                dj = dear_partition_equal(&p[k].ag, &p[j].ag);
            int ne = 0;
            double tij = dj ? INFINITY : pairing(prob, &p[i], &p[j], &ne, &rc), ti;
            if (rc != DEAR_OK || !isfinite(tij))
                continue;
            rc = refined(&cur, prob, p, i, j, ne, tij, &ti);
            if (rc == DEAR_OK && ti < best && ti < tbase * (1 - AUTO_PAIR_GAIN)) {
                dear_plan_free(&won);
                won = cur;
                cur = (dear_plan_t){ 0 };
                best = ti;
                wi = i, wj = j, we = ne;
                *tpre = tij;
            }
        }
    }
    dear_plan_free(&cur);
    if (rc != DEAR_OK) {
        dear_plan_free(&won);
        return rc;
    }
    dear_plan_free(plan);
    *plan = won;
    t[wi] = best;
    bj[wi] = wj;
    be[wi] = we;
    *bi = wi;
    return DEAR_OK;
}

/* The plan tied with auto's plan (predicted tbest, after refine_early) into *tie, named
 * auto-tie:WHO, or nothing (tie->nunits 0) where none is. First the candidates' whole plans (each
 * planner's buckets with its own all-gather side, the plan that planner alone runs): of those
 * with buckets unlike the plan's predicted within DEAR_AUTO_TIE of tbest, the one of the most
 * collectives, then the lower prediction. Else, of the candidates' bucketings unlike the plan's
 * whose best pairing predicted within DEAR_AUTO_TIE of the plan's bucketing before refine_early
 * (tpre), the one of the most buckets, with the plan's all-gather side where that keeps it within
 * DEAR_AUTO_TIE of tbest, else with its own. Why: the model does not tell such plans apart, and
 * the tie rule gave the fewest collectives; the other end of the tie is where the model's error
 * on start-ups and overlap shows most, so auto's check measures it, and a whole plan because an
 * all-gather side made for few buckets runs slower behind many than one made for them. */
static int tied(const dear_plan_problem_t *prob, const dear_plan_t *plan, double tbest, double tpre,
                const dear_plan_t *p, int nc, int bi, const double *t, const int *bj, const int *be, dear_plan_t *tie,
                double *tie_pred)
{
    int w = -1, rc = DEAR_OK;
    double tw = INFINITY;
    for (int i = 0; i < nc && rc == DEAR_OK; i++) {
        if (i == bi || dear_partition_equal(&p[i].rs, &plan->rs))
            continue;
        double ti = dear_planner_predict(prob, &p[i], &rc);
        if (rc != DEAR_OK || !(ti <= tbest * (1 + DEAR_AUTO_TIE)))
            continue;
        int more = w < 0 ? 1 : collectives(prob, &p[i], &p[i]) - collectives(prob, &p[w], &p[w]);
        if (more > 0 || (more == 0 && ti < tw))
            w = i, tw = ti;
    }
    if (rc == DEAR_OK && w >= 0) {
        rc = dear_plan_copy(tie, &p[w]);
        if (rc == DEAR_OK) {
            snprintf(tie->planner, sizeof tie->planner, "auto-tie:%.22s", p[w].planner);
            *tie_pred = tw;
        }
        return rc;
    }
    int c = -1;
    for (int i = 0; i < nc; i++)
        if (i != bi && t[i] <= tpre * (1 + DEAR_AUTO_TIE) && !dear_partition_equal(&p[i].rs, &plan->rs) &&
            (c < 0 || p[i].rs.ngroups > p[c].rs.ngroups))
            c = i;
    if (c < 0)
        return DEAR_OK;
    /* the plan's all-gather side whole: its groups and whichever of them run early */
    dear_plan_t mix = { 0 };
    rc = dear_plan_copy(&mix, plan);
    if (rc == DEAR_OK)
        rc = dear_partition_set(&mix.rs, mix.nunits, p[c].rs.ngroups, p[c].rs.first);
    double tm = rc == DEAR_OK ? dear_planner_predict(prob, &mix, &rc) : INFINITY;
    char name[sizeof tie->planner];
    snprintf(name, sizeof name, "auto-tie:%.22s", p[c].planner);
    if (rc == DEAR_OK && tm <= tbest * (1 + DEAR_AUTO_TIE)) {
        snprintf(mix.planner, sizeof mix.planner, "%s", name);
        dear_plan_free(tie);
        *tie = mix;
        mix = (dear_plan_t){ 0 };
    } else if (rc == DEAR_OK && t[c] <= tbest * (1 + DEAR_AUTO_TIE)) {
        rc = compose(tie, &p[c], &p[bj[c]], be[c], name);
        tm = t[c];
    }
    if (rc == DEAR_OK && tie->nunits > 0)
        *tie_pred = tm;
    dear_plan_free(&mix);
    return rc;
}

/* auto's plan, and (runners != NULL) up to max runners-up fastest predicted first, each with
 * reduce-scatter buckets unlike the best plan's and each other's: the other candidates' buckets,
 * and the best plan's with every two neighbouring buckets joined (half as many: where the cost
 * model underprices a collective's start-up, a plan of many small buckets is the one it gets
 * wrong). Under schedule dear each takes the best all-gather groups unlike the best plan's where
 * a candidate offers others: a runner-up is tried because the best plan lost, and the model may
 * have mispriced either phase, so one phase changed alone may repeat the loss. *nrun gets how
 * many; pred[k] their predicted iterations. */
static int plan_auto(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_plan_t *runners, double *pred,
                     int max, int *nrun, dear_plan_t *tie, double *tie_pred)
{
    int rc = dear_planner_check(prob);
    if (rc != DEAR_OK)
        return rc;
    /* One slot more than the candidates: the best plan's buckets halved. */
    dear_plan_t p[DEAR_PLANNER_COUNT + 1];
    memset(p, 0, sizeof p);
    int NC = 0;
    rc = candidates(prob, p, &NC);
    /* Schedule dear has two independent phases: every pair (reduce-scatter buckets of one
     * planner, all-gather groups of another) is simulated. The others only have buckets. */
    double t[DEAR_PLANNER_COUNT + 1];
    int bj[DEAR_PLANNER_COUNT + 1], be[DEAR_PLANNER_COUNT + 1], bi = 0;
    for (int i = 0; i < NC && rc == DEAR_OK; i++) {
        t[i] = best_pairing(prob, &p[i], p, NC, i, NULL, &bj[i], &be[i], &rc);
        if (rc == DEAR_OK)
            DEAR_DEBUG("plan", "auto: candidate %s, %d bucket(s), best with %s's %d all-gather group(s), %d early: "
                               "predicted %.3f ms",
                       p[i].planner, p[i].rs.ngroups, p[bj[i]].planner, p[bj[i]].ag.ngroups, be[i], 1e3 * t[i]);
    }
    char name[sizeof plan->planner];
    double tb = INFINITY; /* the chosen bucketing's best pairing, before refine_early */
    rc = refine_all(plan, prob, p, NC, t, bj, be, &bi, &tb, rc);
    if (runners && nrun)
        *nrun = 0;
    if (tie) {
        dear_plan_free(tie);
        *tie_pred = INFINITY;
        if (rc == DEAR_OK)
            rc = tied(prob, plan, t[bi], tb, p, NC, bi, t, bj, be, tie, tie_pred);
    }
    if (max > DEAR_AUTO_MAX_RUNNERS)
        max = DEAR_AUTO_MAX_RUNNERS;
    if (runners && nrun && rc == DEAR_OK && max > 0) {
        int n = NC, nb = p[bi].rs.ngroups;
        if (nb > 1) {
            int *first = malloc(sizeof(int) * (size_t)(nb / 2 + 2)), k = 0;
            if (!first)
                rc = DEAR_ERR_NOMEM;
            for (int g = 0; rc == DEAR_OK && g < nb; g += 2)
                first[k++] = p[bi].rs.first[g];
            if (rc == DEAR_OK) {
                first[k] = p[bi].rs.first[nb];
                p[n] = (dear_plan_t){ .nunits = p[bi].nunits, .ntensors = p[bi].ntensors };
                char who[sizeof p[bi].planner];
                memcpy(who, p[bi].planner, sizeof who);
                snprintf(p[n].planner, sizeof p[n].planner, "%.24s/2", who);
                /* buckets only: best_pairing gives it its all-gather side (under wfbp and
                 * sync the best plan's, self = bi) */
                rc = dear_partition_set(&p[n].rs, p[n].nunits, k, first);
                if (rc == DEAR_OK)
                    t[n] = best_pairing(prob, &p[n], p, NC, bi, NULL, &bj[n], &be[n], &rc);
                n++;
            }
            free(first);
        }
        /* Every bucketing's all-gather side again, unlike the best plan's where one can be. */
        const dear_partition_t *avoid = &p[bj[bi]].ag;
        for (int i = 0; i < n && rc == DEAR_OK; i++) {
            if (i == bi) /* the best plan itself is never a runner-up */
                continue;
            int j2 = 0, e2 = 0;
            double t2 = best_pairing(prob, &p[i], p, NC, i < NC ? i : bi, avoid, &j2, &e2, &rc);
            if (isfinite(t2))
                t[i] = t2, bj[i] = j2, be[i] = e2;
        }
        /* The distinct bucketings, fastest first (selection: a handful of candidates). */
        int used[DEAR_PLANNER_COUNT + 1] = { 0 };
        used[bi] = 1;
        while (rc == DEAR_OK && *nrun < max) {
            int c = -1;
            for (int i = 0; i < n; i++) {
                int dup = used[i];
                for (int j = 0; j < n && !dup; j++)
                    dup = used[j] && dear_partition_equal(&p[j].rs, &p[i].rs);
                if (!dup && isfinite(t[i]) && (c < 0 || t[i] < t[c]))
                    c = i;
            }
            if (c < 0)
                break;
            used[c] = 1;
            snprintf(name, sizeof name, "auto-%c:%.24s", (char)('2' + *nrun), p[c].planner);
            rc = compose(&runners[*nrun], &p[c], &p[bj[c]], be[c], name);
            if (rc == DEAR_OK)
                pred[(*nrun)++] = t[c];
        }
    }
    for (int c = 0; c <= NC && c < DEAR_PLANNER_COUNT + 1; c++)
        dear_plan_free(&p[c]);
    return rc;
}

int dear_plan_auto(dear_plan_t *plan, const dear_plan_problem_t *prob)
{
    return plan_auto(plan, prob, NULL, NULL, 0, NULL, NULL, NULL);
}

int dear_plan_auto_runners(dear_plan_t *plan, const dear_plan_problem_t *prob, dear_plan_t *runners, double *pred,
                           int max, int *nrun, dear_plan_t *tie, double *tie_pred)
{
    if (!runners || !pred || !nrun || max < 0 || !tie != !tie_pred) {
        DEAR_ERROR("plan", "auto's runners-up need room for them, their predictions and their count (and the tied "
                           "plan room for its prediction)");
        return DEAR_ERR_ARG;
    }
    return plan_auto(plan, prob, runners, pred, max, nrun, tie, tie_pred);
}

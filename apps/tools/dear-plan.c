/*
 * dear-plan: plan and predict before running. Reads a profile (docs/FORMATS.md), takes a cost
 * model (a preset, an all-reduce alpha/beta, or a calibration file), and prints for every
 * schedule x planner the predicted iteration time, exposed communication, speedups over sync
 * and over wfbp+threshold, bucket counts and the planner's own CPU time. Optionally writes the
 * best plan (DEAR_PLAN_FILE format), its Gantt chart as SVG, and a scaling table over worker
 * counts. Uses the fusion library directly; no MPI is initialised.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/cost.h"
#include "fusion/planfile.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "fusion/sim.h"
#include "fusion/textio.h"
#include "include/dear.h"
#include "runtime/util.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dear-plan --profile FILE (--preset NAME | --alpha A --beta B | --cost FILE)\n"
            "                 --workers P [options]\n"
            "Predict iteration times of the sync, wfbp and dear schedules under every planner.\n"
            "\n"
            "  --profile FILE      model profile (docs/FORMATS.md; fusion/profiles/ ships five)\n"
            "  --preset NAME       cost preset: %s (published all-reduce fits, scaled to P)\n"
            "  --alpha A --beta B  all-reduce start-up (s) and per-byte time (s/B) at P workers;\n"
            "                      reduce-scatter and all-gather are taken as half each\n"
            "  --cost FILE         calibration cache (DEAR_CALIBRATION_FILE) entry for P workers\n"
            "  --ranks-per-host R  key of the --cost entry (default 1)\n"
            "  --workers P         number of workers (>= 2)\n"
            "  --schedule S        sync|wfbp|dear|all (default all)\n"
            "  --planner X         %s|all (default all)\n"
            "  --threshold BYTES   threshold planner bucket size (default 26214400 = 25 MiB)\n"
            "  --cap BYTES         cap on bucket memory, enforced by gradssa and auto (default none)\n"
            "  --seed N            gradssa seed (default 1)\n"
            "  --svg OUT           Gantt chart of the best row shown\n"
            "  --plan-out FILE     write the plan of the best row shown (DEAR_PLAN_FILE format)\n"
            "  --scale P1,P2,...   also print the best times when scaled to these worker counts\n"
            "                      (ring model: alpha ~ P-1, beta ~ 2(P-1)/P)\n"
            "  --csv               print CSV instead of the table\n"
            "  --help              this text\n",
            dear_cost_preset_names(), dear_plan_names());
}

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "dear-plan: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (try --help)\n");
    return 2;
}

typedef struct {
    const char *preset;
    double alpha, beta;
    int have_ab;
    const char *cost_file;
    int rph;
} cost_src_t;

static int make_model(const cost_src_t *src, int P, int base_p, dear_cost_model_t *m)
{
    if (src->preset)
        return dear_cost_preset(src->preset, P, 1, m);
    if (src->have_ab) {
        dear_cost_model_t b;
        int rc = dear_cost_from_alpha_beta(src->alpha, src->beta, base_p, &b);
        return rc != DEAR_OK ? rc : dear_cost_scale(&b, P, m);
    }
    int found = 0;
    dear_cost_model_t b;
    int rc = dear_cost_load(src->cost_file, base_p, src->rph, &b, &found);
    if (rc != DEAR_OK)
        return rc;
    if (!found) {
        fprintf(stderr, "dear-plan: %s has no entry for P=%d, %d rank(s) per host\n", src->cost_file, base_p, src->rph);
        return DEAR_ERR_ARG;
    }
    for (int op = 0; op < DEAR_COST_NOPS; op++) {
        int any = 0;
        for (int a = 0; a < DEAR_COST_NALGOS; a++)
            any |= b.line[op][a].valid;
        if (!any) {
            fprintf(stderr, "dear-plan: %s has no %s line for P=%d, %d rank(s) per host\n", src->cost_file,
                    dear_cost_op_name((dear_cost_op_t)op), base_p, src->rph);
            return DEAR_ERR_ARG;
        }
    }
    return P == base_p ? (*m = b, DEAR_OK) : dear_cost_scale(&b, P, m);
}

/* A plan with a bucket over --cap costs the simulator's penalty: report it as over the cap. */
static int over_cap(double t)
{
    return t >= DEAR_SIM_CAP_PENALTY_S;
}

static double ratio(double ref, double t)
{
    return over_cap(ref) || over_cap(t) ? NAN : ref / t;
}

typedef struct {
    dear_sim_sched_t sched;
    const char *planner;
    double iter, exposed, plan_s;
    int nrs, nag, nearly;
    dear_plan_t plan;
} row_t;

static const char *const planners[] = { "none", "threshold", "mgwfbp", "dp", "gradssa", "auto" };
#define NPLANNERS 6

/* Evaluate the selected rows for one cost model. rows must hold 1 + 2 * NPLANNERS entries. */
static int evaluate(const dear_profile_t *prof, const dear_cost_model_t *model, int sched_sel, const char *plan_sel,
                    size_t threshold, size_t cap, unsigned long seed, row_t *rows, int *nrows, double *t_sync,
                    double *t_wthr, double *t_dthr)
{
    int n = 0;
    static const dear_sim_sched_t order[DEAR_SIM_SCHED_COUNT] = { DEAR_SIM_SCHED_SYNC, DEAR_SIM_SCHED_WFBP,
                                                                 DEAR_SIM_SCHED_DEAR };
    for (int si = 0; si < DEAR_SIM_SCHED_COUNT; si++) {
        int s = (int)order[si];
        int want_s = sched_sel < 0 || sched_sel == s;
        for (int p = 0; p < (s == DEAR_SIM_SCHED_SYNC ? 1 : NPLANNERS); p++) {
            const char *pname = s == DEAR_SIM_SCHED_SYNC ? "one" : planners[p];
            int want = want_s && (s == DEAR_SIM_SCHED_SYNC || !plan_sel || strcmp(plan_sel, pname) == 0);
            /* References are computed even when not shown: sync, and threshold under wfbp and dear. */
            int is_ref = s == DEAR_SIM_SCHED_SYNC || strcmp(pname, "threshold") == 0;
            if (!want && !is_ref)
                continue;
            dear_sim_model_arg_t marg;
            dear_plan_problem_t prob;
            int rc = dear_plan_problem_init(&prob, prof, (dear_sim_sched_t)s, model, cap, &marg);
            if (rc != DEAR_OK)
                return rc;
            prob.threshold = threshold;
            prob.seed = seed;
            row_t r = { .sched = (dear_sim_sched_t)s, .planner = s == DEAR_SIM_SCHED_SYNC ? "-" : pname };
            /* CPU time of this thread: on a shared machine wall time mostly measures the neighbours. */
            double t0 = dear_thread_cpu();
            rc = dear_plan_by_name(&r.plan, &prob, pname);
            r.plan_s = dear_thread_cpu() - t0;
            if (rc != DEAR_OK)
                return rc;
            dear_sim_result_t res = { 0 };
            rc = dear_sim_run(prof, &prob.cost, (dear_sim_sched_t)s, &r.plan, 0, &res);
            if (rc != DEAR_OK) {
                dear_plan_free(&r.plan);
                return rc;
            }
            r.iter = res.iter_s;
            r.exposed = res.exposed_s;
            r.nrs = s == DEAR_SIM_SCHED_SYNC ? 1 : r.plan.rs.ngroups;
            r.nag = s == DEAR_SIM_SCHED_DEAR ? r.plan.ag.ngroups : 0;
            r.nearly = s == DEAR_SIM_SCHED_DEAR ? r.plan.ag_early : 0;
            if (s == DEAR_SIM_SCHED_SYNC)
                *t_sync = r.iter;
            if (is_ref && s == DEAR_SIM_SCHED_WFBP)
                *t_wthr = r.iter;
            if (is_ref && s == DEAR_SIM_SCHED_DEAR)
                *t_dthr = r.iter;
            if (want)
                rows[n++] = r;
            else
                dear_plan_free(&r.plan);
        }
    }
    *nrows = n;
    return DEAR_OK;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "profile", required_argument, 0, 'f' }, { "preset", required_argument, 0, 'p' },
        { "alpha", required_argument, 0, 'a' },   { "beta", required_argument, 0, 'b' },
        { "cost", required_argument, 0, 'c' },    { "ranks-per-host", required_argument, 0, 'r' },
        { "workers", required_argument, 0, 'w' }, { "schedule", required_argument, 0, 's' },
        { "planner", required_argument, 0, 'x' }, { "threshold", required_argument, 0, 't' },
        { "cap", required_argument, 0, 'm' },     { "seed", required_argument, 0, 'S' },
        { "svg", required_argument, 0, 'g' },     { "plan-out", required_argument, 0, 'o' },
        { "scale", required_argument, 0, 'k' },   { "csv", no_argument, 0, 'C' },
        { "help", no_argument, 0, 'h' },          { 0, 0, 0, 0 }
    };
    const char *profile = NULL, *svg = NULL, *plan_out = NULL, *scale = NULL, *plan_sel = NULL;
    cost_src_t src = { .rph = 1 };
    long workers = 0, seed = 1, threshold = 26214400, cap = 0;
    int sched_sel = -1, csv = 0, have_a = 0, have_b = 0;
    long v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'f': profile = optarg; break;
        case 'p': src.preset = optarg; break;
        case 'a':
            if (dear_text_double(optarg, -HUGE_VAL, HUGE_VAL, &src.alpha) || src.alpha < 0)
                return fail("--alpha '%s' is not a time in seconds >= 0", optarg);
            have_a = 1;
            break;
        case 'b':
            if (dear_text_double(optarg, -HUGE_VAL, HUGE_VAL, &src.beta) || src.beta < 0)
                return fail("--beta '%s' is not a time per byte in seconds >= 0", optarg);
            have_b = 1;
            break;
        case 'c': src.cost_file = optarg; break;
        case 'r':
            if (dear_text_long(optarg, 1, 1 << 20, &v))
                return fail("--ranks-per-host '%s' is not an integer >= 1", optarg);
            src.rph = (int)v;
            break;
        case 'w':
            if (dear_text_long(optarg, 2, 1 << 24, &workers))
                return fail("--workers '%s' is not an integer >= 2", optarg);
            break;
        case 's':
            if (strcmp(optarg, "all") == 0) {
                sched_sel = -1;
            } else {
                dear_sim_sched_t s;
                if (dear_sim_sched_parse(optarg, &s))
                    return fail("--schedule '%s' is not one of sync|wfbp|dear|all", optarg);
                sched_sel = (int)s;
            }
            break;
        case 'x': {
            int ok = strcmp(optarg, "all") == 0;
            for (int i = 0; i < NPLANNERS; i++)
                ok |= strcmp(optarg, planners[i]) == 0;
            if (!ok)
                return fail("--planner '%s' is not one of none|threshold|mgwfbp|dp|gradssa|auto|all", optarg);
            plan_sel = strcmp(optarg, "all") == 0 ? NULL : optarg;
            break;
        }
        case 't':
            if (dear_text_long(optarg, 1, __LONG_MAX__, &threshold))
                return fail("--threshold '%s' is not a size in bytes >= 1", optarg);
            break;
        case 'm':
            if (dear_text_long(optarg, 1, __LONG_MAX__, &cap))
                return fail("--cap '%s' is not a size in bytes >= 1", optarg);
            break;
        case 'S':
            if (dear_text_long(optarg, 0, __LONG_MAX__, &seed))
                return fail("--seed '%s' is not an integer >= 0", optarg);
            break;
        case 'g': svg = optarg; break;
        case 'o': plan_out = optarg; break;
        case 'k': scale = optarg; break;
        case 'C': csv = 1; break;
        case 'h': usage(stdout); return 0;
        default:
            return fail("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail("unexpected argument '%s'", argv[optind]);
    if (!profile)
        return fail("%s", "--profile FILE is required");
    if (!workers)
        return fail("%s", "--workers P is required");
    src.have_ab = have_a || have_b;
    if (src.have_ab && !(have_a && have_b))
        return fail("%s", "--alpha and --beta go together");
    if ((src.preset != NULL) + src.have_ab + (src.cost_file != NULL) != 1)
        return fail("%s", "give exactly one cost model: --preset NAME, --alpha A --beta B, or --cost FILE");

    int P = (int)workers, rc;
    dear_profile_t prof = { 0 };
    if (dear_prof_load(profile, &prof) != DEAR_OK) {
        fprintf(stderr, "dear-plan: cannot use profile %s (see the error above)\n", profile);
        return 1;
    }
    dear_cost_model_t model;
    if ((rc = make_model(&src, P, P, &model)) != DEAR_OK) {
        fprintf(stderr, "dear-plan: no cost model: %s\n", dear_status_string(rc));
        dear_prof_free(&prof);
        return 2;
    }
    row_t rows[1 + 2 * NPLANNERS];
    int nrows = 0;
    double t_sync = NAN, t_wthr = NAN, t_dthr = NAN;
    rc = evaluate(&prof, &model, sched_sel, plan_sel, (size_t)threshold, (size_t)cap, (unsigned long)seed, rows,
                  &nrows, &t_sync, &t_wthr, &t_dthr);
    if (rc != DEAR_OK) {
        fprintf(stderr, "dear-plan: planning failed: %s\n", dear_status_string(rc));
        dear_prof_free(&prof);
        return 1;
    }
    double F = dear_prof_fwd_total(&prof), B = dear_prof_bwd_total(&prof);
    if (csv) {
        printf("model,workers,schedule,planner,iter_ms,exposed_ms,speedup_sync,speedup_wfbp_threshold,rs_buckets,"
               "ag_groups,plan_cpu_ms,over_cap,ag_early\n");
        for (int i = 0; i < nrows; i++)
            printf("%s,%d,%s,%s,%.4f,%.4f,%.4f,%.4f,%d,%d,%.3f,%d,%d\n", prof.model, P,
                   dear_sim_sched_name(rows[i].sched), rows[i].planner, rows[i].iter * 1e3, rows[i].exposed * 1e3,
                   ratio(t_sync, rows[i].iter), ratio(t_wthr, rows[i].iter), rows[i].nrs, rows[i].nag,
                   rows[i].plan_s * 1e3, over_cap(rows[i].iter), rows[i].nearly);
    } else {
        printf("profile %s (%s): %d layers, %d tensors, %.1f MiB; forward %.2f ms, backward %.2f ms\n", profile,
               prof.model, prof.nlayers, prof.ntensors, dear_prof_bytes_total(&prof) / 1048576.0, F * 1e3, B * 1e3);
        dear_cost_print(stdout, &model);
        printf("\n%-8s %-10s %11s %12s %9s %10s %8s %8s %6s %12s\n", "schedule", "planner", "iter_ms", "exposed_ms",
               "vs_sync", "vs_wfbp_th", "buckets", "ag_grps", "early", "plan_cpu_ms");
        for (int i = 0; i < nrows; i++) {
            if (over_cap(rows[i].iter))
                printf("%-8s %-10s %11s %12s %9s %10s %8d ", dear_sim_sched_name(rows[i].sched), rows[i].planner,
                       "over-cap", "-", "-", "-", rows[i].nrs);
            else
                printf("%-8s %-10s %11.3f %12.3f %8.3fx %9.3fx %8d ", dear_sim_sched_name(rows[i].sched),
                       rows[i].planner, rows[i].iter * 1e3, rows[i].exposed * 1e3, ratio(t_sync, rows[i].iter),
                       ratio(t_wthr, rows[i].iter), rows[i].nrs);
            if (rows[i].sched == DEAR_SIM_SCHED_DEAR)
                printf("%8d %6d", rows[i].nag, rows[i].nearly);
            else
                printf("%8s %6s", "-", "-");
            printf(" %12.3f\n", rows[i].plan_s * 1e3);
        }
    }
    int best = 0;
    for (int i = 1; i < nrows; i++)
        if (rows[i].iter < rows[best].iter)
            best = i;
    int status = 0;
    if (nrows > 0 && (svg || plan_out)) {
        const row_t *r = &rows[best];
        if (!csv)
            printf("\nbest shown: %s + %s, %.3f ms\n", dear_sim_sched_name(r->sched), r->planner, r->iter * 1e3);
        if (svg) {
            dear_sim_model_arg_t marg = { .model = &model, .cap_bytes = (size_t)cap };
            dear_sim_cost_t cost = { dear_sim_cost_model, &marg };
            dear_sim_result_t res = { 0 };
            FILE *f = fopen(svg, "w");
            char title[256];
            snprintf(title, sizeof title, "%s, P=%d (%s), %s + %s", prof.model, P, model.source,
                     dear_sim_sched_name(r->sched), r->planner);
            if (!f) {
                fprintf(stderr, "dear-plan: cannot write %s: %s\n", svg, strerror(errno));
                status = 1;
            } else {
                if (dear_sim_run(&prof, &cost, r->sched, &r->plan, 1, &res) != DEAR_OK ||
                    dear_sim_svg(&res, title, f) != DEAR_OK) {
                    fprintf(stderr, "dear-plan: could not draw %s\n", svg);
                    status = 1;
                }
                if (fclose(f) != 0)
                    status = 1;
                dear_sim_result_free(&res);
            }
        }
        if (plan_out) {
            dear_tensor_desc_t *descs = NULL;
            const char **names = malloc(sizeof(char *) * (size_t)prof.ntensors);
            if (!names || dear_prof_descs(&prof, &descs) != DEAR_OK) {
                status = 1;
            } else {
                for (int t = 0; t < prof.ntensors; t++)
                    names[t] = prof.tensors[t].name;
                if (dear_planfile_save(plan_out, &r->plan, descs, names) != DEAR_OK)
                    status = 1;
            }
            free(names);
            free(descs);
        }
    }
    for (int i = 0; i < nrows; i++)
        dear_plan_free(&rows[i].plan);

    if (scale && status == 0) {
        if (!csv)
            printf("\nscaling (%s; ring model: alpha ~ P-1, beta ~ 2(P-1)/P)\n%7s %10s %10s %-17s %10s %-17s %8s\n",
                   model.source, "workers", "sync_ms", "wfbp_th_ms", "best_wfbp", "dear_th_ms", "best_dear",
                   "gain");
        else
            printf("scale_workers,sync_ms,wfbp_threshold_ms,best_wfbp_ms,best_wfbp_planner,dear_threshold_ms,"
                   "best_dear_ms,best_dear_planner\n");
        char *list = strdup(scale);
        char *save = NULL;
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            long q;
            if (dear_text_long(tok, 2, 1 << 24, &q)) {
                fprintf(stderr, "dear-plan: --scale entry '%s' is not an integer >= 2\n", tok);
                status = 2;
                break;
            }
            dear_cost_model_t m2;
            if (make_model(&src, (int)q, P, &m2) != DEAR_OK) {
                status = 1;
                break;
            }
            row_t r2[1 + 2 * NPLANNERS];
            int n2 = 0;
            double ts = NAN, tw = NAN, tdt = NAN;
            if (evaluate(&prof, &m2, -1, plan_sel, (size_t)threshold, (size_t)cap, (unsigned long)seed, r2, &n2, &ts,
                         &tw, &tdt) != DEAR_OK) {
                status = 1;
                break;
            }
            int bw = -1, bd = -1;
            for (int i = 0; i < n2; i++) {
                if (r2[i].sched == DEAR_SIM_SCHED_WFBP && (bw < 0 || r2[i].iter < r2[bw].iter))
                    bw = i;
                if (r2[i].sched == DEAR_SIM_SCHED_DEAR && (bd < 0 || r2[i].iter < r2[bd].iter))
                    bd = i;
            }
            double other = ts;
            if (bw >= 0 && r2[bw].iter < other)
                other = r2[bw].iter;
            if (csv)
                printf("%ld,%.4f,%.4f,%.4f,%s,%.4f,%.4f,%s\n", q, ts * 1e3, tw * 1e3, bw >= 0 ? r2[bw].iter * 1e3 : NAN,
                       bw >= 0 ? r2[bw].planner : "-", tdt * 1e3,
                       bd >= 0 ? r2[bd].iter * 1e3 : NAN, bd >= 0 ? r2[bd].planner : "-");
            else
                printf("%7ld %10.3f %10.3f %8.3f %-8s %10.3f %8.3f %-8s %7.1f%%\n", q, ts * 1e3, tw * 1e3,
                       bw >= 0 ? r2[bw].iter * 1e3 : NAN, bw >= 0 ? r2[bw].planner : "-",
                       tdt * 1e3, bd >= 0 ? r2[bd].iter * 1e3 : NAN,
                       bd >= 0 ? r2[bd].planner : "-", bd >= 0 ? 100 * (other / r2[bd].iter - 1) : NAN);
            for (int i = 0; i < n2; i++)
                dear_plan_free(&r2[i].plan);
        }
        free(list);
    }
    dear_prof_free(&prof);
    return status;
}

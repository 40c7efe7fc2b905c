/*
 * dear-plan: plan and predict before running. Reads a profile (docs/FORMATS.md), takes a cost
 * model (a preset, an all-reduce alpha/beta, or a calibration file), cuts the tensors into
 * units at the partition size as the runtime does (fusion/units.h), and prints for every
 * schedule x planner the predicted iteration time, exposed communication, speedups over sync
 * and over wfbp+threshold with whole tensors (Horovod, DDP), bucket counts and the planner's own
 * CPU time. Optionally writes the best plan (DEAR_PLAN_FILE format, with its cuts), its Gantt
 * chart as SVG, and a scaling table over worker counts. Uses the fusion library directly; no
 * MPI is initialised.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/cost.h"
#include "fusion/estimate.h"
#include "fusion/planfile.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "fusion/sim.h"
#include "fusion/units.h"
#include "base/fileio.h"
#include "base/params.h"
#include "base/textio.h"
#include "include/dear.h"
#include "base/util.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dear-plan --profile FILE (--preset NAME | --alpha A --beta B | --cost FILE)\n"
            "                 --workers P [options]\n"
            "Predict iteration times of the sync, wfbp and dear schedules under every planner.\n"
            "\n"
            "  --profile FILE      model profile, or model description ('dear-model 1': no times,\n"
            "                      planned from its structure; docs/FORMATS.md; fusion/profiles/\n"
            "                      ships seven of each)\n"
            "  --estimate HOW      plan from the structure, as the runtime does before it has a\n"
            "                      profile: the layers' compute hints (FLOPs) or parameter bytes\n"
            "                      spread the compute; HOW says its total: range (unknown: the plan\n"
            "                      best across compute/communication %g..%g, DEAR_FIRST_PLAN=range),\n"
            "                      first (the profile's own totals, as measured in a first\n"
            "                      iteration, DEAR_FIRST_PLAN=first). With a timed profile every\n"
            "                      plan is then predicted on its times, and vs_prof compares it\n"
            "                      with the plan made from them. Implied (range) by a description\n"
            "  --hints FILE        a model description whose layers' hints --estimate uses\n"            "  --first-min-gain G  --estimate's start: where a model-driven planner's plan is\n"
            "                      predicted less than G faster than the threshold plan, training\n"
            "                      starts on the threshold plan (DEAR_FIRST_MIN_GAIN; default %s);\n"
            "                      a line below the table names that start for --schedule and\n"
            "                      --planner (default dear and auto), with both predictions\n"
            "  --compute-ms MS     forward + backward per iteration (split 1:2) for a model\n"
            "                      description: predictions (and --estimate first) at this total;\n"
            "                      without it they are shown at compute = communication\n"
            "  --preset NAME       cost preset: %s (published all-reduce fits, scaled to P)\n"
            "  --alpha A --beta B  all-reduce start-up (s) and per-byte time (s/B) at P workers;\n"
            "                      reduce-scatter and all-gather are taken as half each\n"
            "  --cost FILE         calibration cache (DEAR_CALIBRATION_FILE) entry for P workers\n"
            "  --ranks-per-host R  key of the --cost entry (default 1)\n"
            "  --inflight K        the --cost entry's burst curves for K collectives in flight\n"
            "                      (DEAR_MAX_INFLIGHT; default %s): a collective queued behind\n"
            "                      others is priced by them (1: as alone)\n"
            "  --workers P         number of workers (>= 2)\n"
            "  --schedule S        sync|wfbp|dear|all (default all)\n"
            "  --planner X         %s|all (default all)\n"
            "  --threshold BYTES   threshold planner bucket size (default 26214400 = 25 MiB)\n"
            "  --partition BYTES   cut tensors larger than this into chunks the planners place\n"
            "                      like tensors (k/m/g suffix; default %s, DEAR_PARTITION's;\n"
            "                      0: never cut); the wfbp+threshold reference keeps them whole\n"
            "  --cap BYTES         cap on bucket memory, enforced by gradssa and auto (default none)\n"
            "  --seed N            gradssa seed (default 1)\n"
            "  --svg OUT           Gantt chart of the best row shown\n"
            "  --plan-out FILE     write the plan of the best row shown (DEAR_PLAN_FILE format)\n"
            "  --scale P1,P2,...   also print the best times when scaled to these worker counts\n"
            "                      (ring model: alpha ~ P-1, beta ~ 2(P-1)/P)\n"
            "  --dense             price sparse tensors (profile 'sparse' records) as dense\n"
            "  --compress RS[/AG]  gradients travel compressed (DEAR_COMPRESS, DEAR_COMPRESS_AG): %s for\n"
            "                      the reduce-scatters (all-reduces), and the all-gathers when AG is not\n"
            "                      given; every tensor is taken as float32 and priced at the bytes that\n"
            "                      travel, the wfbp+threshold reference too (default none)\n"
            "  --csv               print CSV instead of the table\n"
            "  --help              this text\n",
            DEAR_ROBUST_LO, DEAR_ROBUST_HI, dear_param_table[DEAR_P_FIRST_MIN_GAIN].defval, dear_cost_preset_names(),
            dear_param_table[DEAR_P_MAX_INFLIGHT].defval, DEAR_PLANNER_CHOICES,
            dear_param_table[DEAR_P_PARTITION].defval, DEAR_COMPRESS_CHOICES);
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
    long long inflight;   /* DEAR_MAX_INFLIGHT: which burst curves of cost_file price queued collectives */
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
    /* The burst curves of the in-flight count training will run with. */
    int rc = dear_cost_load_ex(src->cost_file, base_p, src->rph, (int)src->inflight, &b, &found);
    if (rc != DEAR_OK)
        return rc;
    if (!found) {
        fprintf(stderr, "dear-plan: %s has no entry for P=%d, %d rank(s) per host\n", src->cost_file, base_p, src->rph);
        return DEAR_ERR_ARG;
    }
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
        int any = 0;
        for (int a = 0; a < DEAR_ALGO_COUNT; a++)
            any |= b.line[op][a].valid;
        if (!any) {
            fprintf(stderr, "dear-plan: %s has no %s line for P=%d, %d rank(s) per host\n", src->cost_file,
                    dear_coll_op_short((dear_coll_op_t)op), base_p, src->rph);
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
    dear_sched_t sched;
    const char *planner;
    double iter, exposed, plan_s;
    double iter_prof;   /* --estimate on a timed profile: the plan made from its times, predicted */
    /* --estimate, model-driven planners: the plan training starts on (DEAR_FIRST_MIN_GAIN):
     * the decision (both predictions, the gain, whether the threshold plan runs instead), and
     * the predicted iteration of the plan that runs. start.gain NaN: not judged. */
    dear_first_start_t start;
    double iter_start;
    int nrs, nag, nearly;
    dear_plan_t plan;
} row_t;

#define NPLANNERS DEAR_PLANNER_COUNT

/* The rows of one cost model, and the references, computed even when not shown: sync, and the
 * threshold planner under wfbp and dear. */
typedef struct {
    row_t rows[1 + 2 * NPLANNERS];
    int nrows;
    double t_sync, t_wthr, t_dthr;
} table_t;

enum { EST_OFF, EST_RANGE, EST_FIRST };

typedef struct {
    const char *profile, *svg, *plan_out, *scale, *plan_sel, *hints;
    cost_src_t src;
    long workers, seed, threshold, cap;
    long long partition;
    int sched_sel, csv, dense, estimate;
    double compute_ms;          /* 0: not given */
    double first_min_gain;      /* DEAR_FIRST_MIN_GAIN: what --estimate's start is judged by */
    dear_compress_t comp_rs, comp_ag; /* --compress */
} plan_opts_t;

/* The model as loaded and as the plans see it: its tensors cut into units (fusion/units.h). */
typedef struct {
    dear_profile_t tensors;     /* the profile */
    dear_profile_t prof;        /* its units: what the simulator takes (and the planners, unless est) */
    dear_profile_t est;         /* --estimate: its units with times from the structure, for the planners */
    dear_unit_t *units;         /* NULL: no tensor cut */
    int nunits, timed;          /* timed: prof holds measured (profiled) times */
} model_t;

static void model_free(model_t *m)
{
    dear_prof_free(&m->tensors);
    dear_prof_free(&m->prof);
    dear_prof_free(&m->est);
    free(m->units);
}

/* The simulated iteration over prof's units of planner pname under schedule s, planned from
 * est (NULL: from prof; range: across the unknown scale), its plan in *plan. */
static int plan_and_run(const dear_profile_t *prof, const dear_profile_t *est, int range,
                        const dear_cost_model_t *model, const plan_opts_t *o, dear_sched_t s, const char *pname,
                        dear_plan_t *plan, dear_sim_result_t *res)
{
    dear_sim_model_arg_t marg;
    dear_plan_problem_t prob;
    int rc = dear_plan_problem_init(&prob, est ? est : prof, s, model, (size_t)o->cap, &marg);
    if (rc != DEAR_OK)
        return rc;
    prob.threshold = (size_t)o->threshold;
    prob.seed = (unsigned long)o->seed;
    dear_planner_t which;
    if (range && s != DEAR_SCHED_SYNC && dear_planner_parse(pname, &which) == 0) {
        dear_robust_range_t rg = { DEAR_ROBUST_LO, DEAR_ROBUST_HI, DEAR_ROBUST_POINTS };
        rc = dear_plan_robust(plan, &prob, which, &rg, NULL);
    } else {
        rc = dear_plan_by_name(plan, &prob, pname);
    }
    if (rc == DEAR_OK)
        rc = dear_sim_run(prof, &prob.cost, s, plan, 0, res);
    return rc;
}

/* The start the runtime makes from an estimated plan (runtime/planning.c, by
 * dear_first_start): at compute = communication (range) or at the estimate's own times (first).
 * Sets r's start and iter_start (the start's iteration on prof). */
static int first_start(const dear_profile_t *prof, const dear_profile_t *est, const dear_cost_model_t *model,
                       const plan_opts_t *o, row_t *r)
{
    dear_sim_model_arg_t marg;
    dear_plan_problem_t prob;
    dear_plan_t thr = { 0 };
    dear_sim_result_t res = { 0 };
    int rc = dear_plan_problem_init(&prob, est, r->sched, model, (size_t)o->cap, &marg);
    if (rc != DEAR_OK)
        return rc;
    prob.threshold = (size_t)o->threshold;
    prob.seed = (unsigned long)o->seed;
    rc = dear_plan_by_name(&thr, &prob, "threshold");
    if (rc == DEAR_OK)
        rc = dear_first_start(&prob, &r->plan, &thr, o->estimate == EST_RANGE ? 1.0 : 0, o->first_min_gain,
                              dear_plan_equal(&r->plan, &thr), &r->start);
    if (rc == DEAR_OK) {
        r->iter_start = r->iter;
        if (r->start.threshold && (rc = dear_sim_run(prof, &prob.cost, r->sched, &thr, 0, &res)) == DEAR_OK)
            r->iter_start = res.iter_s;
    }
    dear_plan_free(&thr);
    return rc;
}

/* Evaluate the rows of schedule sched_sel (-1: all) and the planner of o for one cost model. */
static int evaluate(const model_t *mu, const dear_cost_model_t *model, const plan_opts_t *o, int sched_sel,
                    table_t *tab)
{
    const dear_profile_t *prof = &mu->prof;
    int n = 0;
    static const dear_sched_t order[DEAR_SCHED_COUNT] = { DEAR_SCHED_SYNC, DEAR_SCHED_WFBP,
                                                                 DEAR_SCHED_DEAR };
    tab->t_sync = tab->t_wthr = tab->t_dthr = NAN;
    for (int si = 0; si < DEAR_SCHED_COUNT; si++) {
        int s = (int)order[si];
        int want_s = sched_sel < 0 || sched_sel == s;
        for (int p = 0; p < (s == DEAR_SCHED_SYNC ? 1 : NPLANNERS); p++) {
            const char *pname = s == DEAR_SCHED_SYNC ? "one" : dear_planner_name((dear_planner_t)p);
            int want = want_s && (s == DEAR_SCHED_SYNC || !o->plan_sel || strcmp(o->plan_sel, pname) == 0);
            /* References are computed even when not shown: sync, and threshold under wfbp and dear. */
            int is_ref = s == DEAR_SCHED_SYNC || p == DEAR_PLANNER_THRESHOLD;
            if (!want && !is_ref)
                continue;
            row_t r = { .sched = (dear_sched_t)s, .planner = s == DEAR_SCHED_SYNC ? "-" : pname };
            dear_sim_result_t res = { 0 };
            /* CPU time of this thread: on a shared machine wall time mostly measures the neighbours. */
            double t0 = dear_thread_cpu();
            const dear_profile_t *est = o->estimate ? &mu->est : NULL;
            int rc = plan_and_run(prof, est, o->estimate == EST_RANGE, model, o, (dear_sched_t)s, pname, &r.plan,
                                  &res);
            r.plan_s = dear_thread_cpu() - t0;
            r.iter_prof = r.iter_start = NAN;
            r.start = (dear_first_start_t){ .gain = NAN };
            r.iter = res.iter_s;
            /* The runtime starts from an estimate only with a model-driven planner. */
            if (rc == DEAR_OK && est && s != DEAR_SCHED_SYNC &&
                (dear_planner_flags((dear_planner_t)p) & DEAR_PLANNER_F_MODEL))
                rc = first_start(prof, est, model, o, &r);
            if (rc == DEAR_OK && est && mu->timed) {
                dear_plan_t pp = { 0 };
                dear_sim_result_t pres = { 0 };
                rc = plan_and_run(prof, NULL, 0, model, o, (dear_sched_t)s, pname, &pp, &pres);
                r.iter_prof = pres.iter_s;
                dear_plan_free(&pp);
            }
            if (rc == DEAR_OK)
                rc = dear_plan_set_units(&r.plan, mu->tensors.ntensors, mu->units);
            if (rc != DEAR_OK) {
                dear_plan_free(&r.plan);
                return rc;
            }
            r.exposed = res.exposed_s;
            r.nrs = s == DEAR_SCHED_SYNC ? 1 : r.plan.rs.ngroups;
            r.nag = s == DEAR_SCHED_DEAR ? r.plan.ag.ngroups : 0;
            r.nearly = s == DEAR_SCHED_DEAR ? r.plan.ag_early : 0;
            if (s == DEAR_SCHED_SYNC)
                tab->t_sync = r.iter;
            if (is_ref && s == DEAR_SCHED_WFBP)
                tab->t_wthr = r.iter;
            if (is_ref && s == DEAR_SCHED_DEAR)
                tab->t_dthr = r.iter;
            if (is_ref && s == DEAR_SCHED_WFBP && mu->units) {
                /* The reference runs as Horovod and DDP do: every tensor whole. */
                dear_plan_t whole = { 0 };
                dear_sim_result_t wres = { 0 };
                int r2 = plan_and_run(&mu->tensors, NULL, 0, model, o, DEAR_SCHED_WFBP, pname, &whole, &wres);
                dear_plan_free(&whole);
                if (r2 != DEAR_OK) {
                    dear_plan_free(&r.plan);
                    return r2;
                }
                tab->t_wthr = wres.iter_s;
            }
            if (want)
                tab->rows[n++] = r;
            else
                dear_plan_free(&r.plan);
        }
    }
    tab->nrows = n;
    return DEAR_OK;
}

static void table_free(table_t *tab)
{
    for (int i = 0; i < tab->nrows; i++)
        dear_plan_free(&tab->rows[i].plan);
}

/* Returns 0 to plan, -1 after --help, 2 on a bad argument (said on stderr). */
static int parse_args(int argc, char **argv, plan_opts_t *o)
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
        { "dense", no_argument, 0, 'D' },         { "partition", required_argument, 0, 'P' },
        { "estimate", required_argument, 0, 'E' }, { "hints", required_argument, 0, 'H' },
        { "first-min-gain", required_argument, 0, 'G' }, { "inflight", required_argument, 0, 'I' },
        { "compute-ms", required_argument, 0, 'M' }, { "compress", required_argument, 0, 'z' },
        { "help", no_argument, 0, 'h' },          { 0, 0, 0, 0 }
    };
    *o = (plan_opts_t){ .src = { .rph = 1 }, .seed = 1, .threshold = 26214400, .sched_sel = -1 };
    if (dear_text_double(dear_param_table[DEAR_P_FIRST_MIN_GAIN].defval, 0, 1, &o->first_min_gain))
        return fail("%s", "the parameter table's DEAR_FIRST_MIN_GAIN default is not a share");
    char msg[256];
    if (dear_param_parse_int(DEAR_P_PARTITION, dear_param_table[DEAR_P_PARTITION].defval, &o->partition, msg,
                             sizeof msg) != DEAR_OK ||
        dear_param_parse_int(DEAR_P_MAX_INFLIGHT, dear_param_table[DEAR_P_MAX_INFLIGHT].defval, &o->src.inflight,
                             msg, sizeof msg) != DEAR_OK)
        return fail("%s", msg);
    int have_a = 0, have_b = 0;
    long v;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'f': o->profile = optarg; break;
        case 'p': o->src.preset = optarg; break;
        case 'a':
            if (dear_text_double(optarg, -HUGE_VAL, HUGE_VAL, &o->src.alpha) || o->src.alpha < 0)
                return fail("--alpha '%s' is not a time in seconds >= 0", optarg);
            have_a = 1;
            break;
        case 'b':
            if (dear_text_double(optarg, -HUGE_VAL, HUGE_VAL, &o->src.beta) || o->src.beta < 0)
                return fail("--beta '%s' is not a time per byte in seconds >= 0", optarg);
            have_b = 1;
            break;
        case 'c': o->src.cost_file = optarg; break;
        case 'I':
            if (dear_param_parse_int(DEAR_P_MAX_INFLIGHT, optarg, &o->src.inflight, msg, sizeof msg) != DEAR_OK)
                return fail("--inflight: %s", msg);
            break;
        case 'r':
            if (dear_text_long(optarg, 1, 1 << 20, &v))
                return fail("--ranks-per-host '%s' is not an integer >= 1", optarg);
            o->src.rph = (int)v;
            break;
        case 'w':
            if (dear_text_long(optarg, 2, 1 << 24, &o->workers))
                return fail("--workers '%s' is not an integer >= 2", optarg);
            break;
        case 's':
            if (strcmp(optarg, "all") == 0) {
                o->sched_sel = -1;
            } else {
                dear_sched_t s;
                if (dear_sched_parse(optarg, &s))
                    return fail("--schedule '%s' is not one of %s|all", optarg, DEAR_SCHED_CHOICES);
                o->sched_sel = (int)s;
            }
            break;
        case 'x': {
            dear_planner_t pl;
            if (strcmp(optarg, "all") != 0 && dear_planner_parse(optarg, &pl) != 0)
                return fail("--planner '%s' is not one of %s|all", optarg, DEAR_PLANNER_CHOICES);
            o->plan_sel = strcmp(optarg, "all") == 0 ? NULL : optarg;
            break;
        }
        case 't':
            if (dear_text_long(optarg, 1, __LONG_MAX__, &o->threshold))
                return fail("--threshold '%s' is not a size in bytes >= 1", optarg);
            break;
        case 'm':
            if (dear_text_long(optarg, 1, __LONG_MAX__, &o->cap))
                return fail("--cap '%s' is not a size in bytes >= 1", optarg);
            break;
        case 'S':
            if (dear_text_long(optarg, 0, __LONG_MAX__, &o->seed))
                return fail("--seed '%s' is not an integer >= 0", optarg);
            break;
        case 'g': o->svg = optarg; break;
        case 'o': o->plan_out = optarg; break;
        case 'k': o->scale = optarg; break;
        case 'C': o->csv = 1; break;
        case 'D': o->dense = 1; break;
        case 'z': {
            char rs[16];
            const char *slash = strchr(optarg, '/');
            snprintf(rs, sizeof rs, "%.*s", slash ? (int)(slash - optarg) : (int)strlen(optarg), optarg);
            if (dear_compress_parse(rs, &o->comp_rs) || dear_compress_parse(slash ? slash + 1 : rs, &o->comp_ag))
                return fail("--compress '%s' is not RS[/AG], each one of %s", optarg, DEAR_COMPRESS_CHOICES);
            break;
        }
        case 'P':
            if (dear_param_parse_int(DEAR_P_PARTITION, optarg, &o->partition, msg, sizeof msg) != DEAR_OK)
                return fail("--partition '%s' is not a size in bytes (0 or more; k/m/g suffix)", optarg);
            break;
        case 'E':
            if (strcmp(optarg, "range") && strcmp(optarg, "first"))
                return fail("--estimate '%s' is not one of range|first", optarg);
            o->estimate = strcmp(optarg, "range") == 0 ? EST_RANGE : EST_FIRST;
            break;
        case 'H': o->hints = optarg; break;
        case 'G':
            if (dear_text_double(optarg, 0, 1, &o->first_min_gain))
                return fail("--first-min-gain '%s' is not a share between 0 and 1", optarg);
            break;
        case 'M':
            if (dear_text_double(optarg, 1e-6, 1e9, &o->compute_ms))
                return fail("--compute-ms '%s' is not a time in milliseconds in [1e-6, 1e9]", optarg);
            break;
        case 'h': usage(stdout); return -1;
        default:
            return fail("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail("unexpected argument '%s'", argv[optind]);
    if (!o->profile)
        return fail("%s", "--profile FILE is required");
    if (!o->workers)
        return fail("%s", "--workers P is required");
    o->src.have_ab = have_a || have_b;
    if (o->src.have_ab && !(have_a && have_b))
        return fail("%s", "--alpha and --beta go together");
    if ((o->src.preset != NULL) + o->src.have_ab + (o->src.cost_file != NULL) != 1)
        return fail("%s", "give exactly one cost model: --preset NAME, --alpha A --beta B, or --cost FILE");
    if (o->hints && !o->estimate)
        return fail("%s", "--hints goes with --estimate");
    return 0;
}

static void print_csv(const model_t *mu, const plan_opts_t *o, int P, const table_t *tab)
{
    printf("model,workers,schedule,planner,iter_ms,exposed_ms,speedup_sync,speedup_wfbp_threshold,rs_buckets,"
           "ag_groups,plan_cpu_ms,over_cap,ag_early,partition_bytes,units,estimate,profiled_plan_iter_ms,"
           "first_gain,start,start_iter_ms\n");
    for (int i = 0; i < tab->nrows; i++) {
        const row_t *r = &tab->rows[i];
        printf("%s,%d,%s,%s,%.4f,%.4f,%.4f,%.4f,%d,%d,%.3f,%d,%d,%lld,%d,%s,%.4f,%.4f,%s,%.4f\n", mu->tensors.model,
               P, dear_sched_name(r->sched), r->planner, r->iter * 1e3, r->exposed * 1e3, ratio(tab->t_sync, r->iter),
               ratio(tab->t_wthr, r->iter), r->nrs, r->nag, r->plan_s * 1e3, over_cap(r->iter), r->nearly,
               o->partition, mu->nunits, o->estimate == EST_RANGE ? "range" : o->estimate ? "first" : "off",
               r->iter_prof * 1e3, r->start.gain, isnan(r->start.gain) ? "" : r->start.threshold ? "threshold" : "plan",
               r->iter_start * 1e3);
    }
}

/* Bytes all the tensors put on the wire in one collective of op each. */
static double wire_total(const dear_profile_t *prof, dear_coll_op_t op)
{
    double w = 0;
    for (int t = 0; t < prof->ntensors; t++)
        w += dear_prof_wire_bytes(&prof->tensors[t], op);
    return w;
}

static void print_table(const char *profile, const model_t *mu, const plan_opts_t *o, const dear_cost_model_t *model,
                        const table_t *tab)
{
    const dear_profile_t *prof = &mu->tensors;
    double F = dear_prof_fwd_total(prof), B = dear_prof_bwd_total(prof);
    printf("profile %s (%s): %d layers, %d tensors, %.1f MiB; forward %.2f ms, backward %.2f ms\n", profile,
           prof->model, prof->nlayers, prof->ntensors, dear_prof_bytes_total(prof) / 1048576.0, F * 1e3, B * 1e3);
    if (o->partition > 0)
        printf("partition %lld bytes: %d units", o->partition, mu->nunits);
    else
        printf("partition 0: every tensor whole");
    for (int i = 0, ncut = 0; mu->units && i < mu->nunits; i++)
        if (mu->units[i].bytes > 0 && mu->units[i].offset == 0) {
            int k = i;
            while (k + 1 < mu->nunits && mu->units[k + 1].tensor == mu->units[i].tensor)
                k++;
            printf("%s %s in %d", ncut++ ? "," : "; cut:", prof->tensors[mu->units[i].tensor].name, k - i + 1);
        }
    printf("\n");
    for (int t = 0; t < prof->ntensors; t++) {
        const dear_prof_tensor_t *pt = &prof->tensors[t];
        if (pt->block_bytes > 0)
            printf("sparse %s: %.1f MiB in blocks of %zu bytes; non-zero blocks %.2f%% (reduce-scatter), %.2f%% "
                   "(all-gather): %.2f and %.2f MiB on the wire\n", pt->name, pt->bytes / 1048576.0, pt->block_bytes,
                   100 * pt->density_rs, 100 * pt->density_ag,
                   dear_prof_wire_bytes(pt, DEAR_COLL_REDUCE_SCATTER) / 1048576.0,
                   dear_prof_wire_bytes(pt, DEAR_COLL_ALLGATHER) / 1048576.0);
        if (pt->block_bytes > 0 && model->ranks_per_host > 1)
            printf("  with %d ranks per host the reduce-scatter's exchange sends each rank's pieces across the link: "
                   "priced as the dense collective of %d times its wire bytes, or of its dense bytes where fewer; "
                   "the all-gather's cross once per host\n", model->ranks_per_host, model->ranks_per_host);
    }
    if (o->comp_rs != DEAR_COMPRESS_NONE || o->comp_ag != DEAR_COMPRESS_NONE)
        printf("compressed: reduce-scatters (all-reduces) %s, all-gathers %s; priced at %.1f and %.1f MiB on the "
               "wire\n", dear_compress_name(o->comp_rs), dear_compress_name(o->comp_ag),
               wire_total(prof, DEAR_COLL_REDUCE_SCATTER) / 1048576.0, wire_total(prof, DEAR_COLL_ALLGATHER) / 1048576.0);
    dear_cost_print(stdout, model);
    if (o->estimate)
        printf("\nplanned from the structure (--estimate %s%s), predicted on %s\n",
               o->estimate == EST_RANGE ? "range" : "first", o->hints ? ", --hints" : "",
               mu->timed ? "the profile's times; vs_prof: over the plan made from them"
               : o->compute_ms > 0 ? "the estimate at --compute-ms" : "the estimate at compute = communication");
    if (o->estimate)
        printf("start: the plan training starts on (DEAR_FIRST_MIN_GAIN=%g): the row's plan, or the threshold plan "
               "where the row's is predicted less than that much faster (gain: at %s); then its predicted "
               "iteration\n",
               o->first_min_gain, o->estimate == EST_RANGE ? "compute = communication" : "the estimate's times");
    printf("\nvs_wfbp_th: over wfbp+threshold with every tensor whole (Horovod, PyTorch DDP)\n");
    printf("%-8s %-10s %11s %12s %9s %10s %8s %8s %6s %12s%s\n", "schedule", "planner", "iter_ms", "exposed_ms",
           "vs_sync", "vs_wfbp_th", "buckets", "ag_grps", "early", "plan_cpu_ms",
           o->estimate && mu->timed ? "  vs_prof" : "");
    for (int i = 0; i < tab->nrows; i++) {
        const row_t *r = &tab->rows[i];
        if (over_cap(r->iter))
            printf("%-8s %-10s %11s %12s %9s %10s %8d ", dear_sched_name(r->sched), r->planner, "over-cap", "-", "-",
                   "-", r->nrs);
        else
            printf("%-8s %-10s %11.3f %12.3f %8.3fx %9.3fx %8d ", dear_sched_name(r->sched), r->planner,
                   r->iter * 1e3, r->exposed * 1e3, ratio(tab->t_sync, r->iter), ratio(tab->t_wthr, r->iter),
                   r->nrs);
        if (r->sched == DEAR_SCHED_DEAR)
            printf("%8d %6d", r->nag, r->nearly);
        else
            printf("%8s %6s", "-", "-");
        printf(" %12.3f", r->plan_s * 1e3);
        if (o->estimate && mu->timed && isfinite(r->iter_prof))
            printf(" %+7.2f%%", 100 * (r->iter / r->iter_prof - 1));
        if (!isnan(r->start.gain))
            printf("  start: %s (gain %+.1f%%), %.3f ms", r->start.threshold ? "threshold" : "plan", 100 * r->start.gain,
                   r->iter_start * 1e3);
        printf("\n");
    }
}

/* --estimate: the plan training would start on, for the row the runtime's defaults pick (the
 * --schedule and --planner given, else DEAR_SCHEDULE's and DEAR_FUSION's defaults), and why:
 * both predictions and the gain against DEAR_FIRST_MIN_GAIN (dear_first_start's decision). */
static void print_start(const plan_opts_t *o, const table_t *tab)
{
    const char *sname = o->sched_sel >= 0 ? dear_sched_name((dear_sched_t)o->sched_sel)
                                          : dear_param_table[DEAR_P_SCHEDULE].defval;
    const char *pname = o->plan_sel ? o->plan_sel : dear_param_table[DEAR_P_FUSION].defval;
    for (int i = 0; i < tab->nrows; i++) {
        const row_t *r = &tab->rows[i];
        if (isnan(r->start.gain) || strcmp(dear_sched_name(r->sched), sname) != 0 || strcmp(r->planner, pname) != 0)
            continue;
        const dear_first_start_t *d = &r->start;
        printf("\ntraining starts on: the %s plan (%s + %s: its plan predicted %.3f ms, the threshold plan %.3f ms at %s; "
               "gain %+.1f%%, %s DEAR_FIRST_MIN_GAIN=%g)\n",
               d->threshold ? "threshold" : pname, sname, pname, d->plan_s * 1e3,
               d->thr_s * 1e3, o->estimate == EST_RANGE ? "compute = communication" : "the estimate's times",
               100 * d->gain, d->threshold ? "under" : "at least", d->min_gain);
        return;
    }
}

/* The Gantt chart of row r as SVG. 0, or 1 when it could not be written. */
static int write_svg(const plan_opts_t *o, const model_t *mu, const dear_cost_model_t *model, int P,
                     const row_t *r)
{
    const dear_profile_t *prof = &mu->prof;
    int status = 0;
    dear_sim_model_arg_t marg = { .model = model, .cap_bytes = (size_t)o->cap };
    dear_sim_cost_t cost = dear_sim_model_cost(&marg);
    dear_sim_result_t res = { 0 };
    dear_file_out_t out;
    char title[256];
    snprintf(title, sizeof title, "%s, P=%d (%s), %s + %s", prof->model, P, model->source, dear_sched_name(r->sched),
             r->planner);
    if (dear_file_out_open(&out, o->svg, "SVG file") != DEAR_OK)
        return 1;
    if (dear_sim_run(prof, &cost, r->sched, &r->plan, 1, &res) != DEAR_OK ||
        dear_sim_svg(&res, title, out.f) != DEAR_OK) {
        fprintf(stderr, "dear-plan: could not draw %s\n", o->svg);
        dear_file_out_abort(&out);
        status = 1;
    } else if (dear_file_out_commit(&out) != DEAR_OK) {
        status = 1;
    }
    dear_sim_result_free(&res);
    return status;
}

/* The plan of row r in DEAR_PLAN_FILE format, with the tensors it was made for. 0, or 1 when it
 * could not be written. */
static int write_plan(const char *path, const model_t *mu, const row_t *r)
{
    const dear_profile_t *prof = &mu->tensors;
    int status = 0;
    dear_tensor_desc_t *descs = NULL;
    const char **names = malloc(sizeof(char *) * (size_t)prof->ntensors);
    if (!names || dear_prof_descs(prof, &descs) != DEAR_OK) {
        status = 1;
    } else {
        for (int t = 0; t < prof->ntensors; t++)
            names[t] = prof->tensors[t].name;
        if (dear_planfile_save(path, &r->plan, descs, names) != DEAR_OK)
            status = 1;
    }
    free(names);
    free(descs);
    return status;
}

/* Where the collectives of row r fall in what a measured model (a calibration cache: curves)
 * covers: below a curve's smallest size a collective is priced at that size, not extrapolated
 * down, and the line states what that adds over the first segment's slope carried down (the
 * penalty for what was not measured); a queued one is priced by the burst curve up to its
 * largest size, and as alone beyond; one on an idle link above the idle curve's smallest size by
 * that curve's slope. */
static void print_measured_range(const model_t *mu, const dear_cost_model_t *model, const plan_opts_t *o,
                                 const row_t *r)
{
    dear_sim_model_arg_t marg = { .model = model, .cap_bytes = (size_t)o->cap };
    dear_sim_cost_t cost = dear_sim_model_cost(&marg);
    dear_sim_result_t res = { 0 };
    if (dear_sim_run(&mu->prof, &cost, r->sched, &r->plan, 1, &res) != DEAR_OK)
        return;
    int n[DEAR_COLL_OP_COUNT] = { 0 }, below[DEAR_COLL_OP_COUNT] = { 0 }, burst[DEAR_COLL_OP_COUNT] = { 0 };
    int idle[DEAR_COLL_OP_COUNT] = { 0 };
    double pen[DEAR_COLL_OP_COUNT] = { 0 };
    for (int i = 0; i < res.nops; i++) {
        int k = res.ops[i].kind;
        const dear_cost_line_t *l = k < DEAR_COLL_OP_COUNT ? &model->line[k][DEAR_ALGO_AUTO] : NULL;
        if (!l || !l->valid || l->npts < 2)
            continue;
        const dear_cost_line_t *b = dear_cost_burst(model, (dear_coll_op_t)k);
        double bytes = (double)res.ops[i].bytes;
        n[k]++;
        below[k] += bytes < l->pt_bytes[0];
        double slope = (l->pt_sec[1] - l->pt_sec[0]) / (l->pt_bytes[1] - l->pt_bytes[0]);
        if (bytes < l->pt_bytes[0] && slope > 0)
            pen[k] += slope * (l->pt_bytes[0] - bytes);
        burst[k] += b && bytes <= b->pt_bytes[b->npts - 1];
        const dear_cost_line_t *il = dear_cost_idle(model, (dear_coll_op_t)k);
        idle[k] += il && bytes > il->pt_bytes[0];
    }
    for (int k = 0; k < DEAR_COLL_OP_COUNT; k++) {
        if (n[k] == 0)
            continue;
        const dear_cost_line_t *l = &model->line[k][DEAR_ALGO_AUTO], *b = dear_cost_burst(model, (dear_coll_op_t)k);
        printf("measured range, %s + %s: %d of %d %s below the smallest size calibrated (%.0f B), priced at it "
               "(+%.3f ms per iteration over its first segment carried down)",
               dear_sched_name(r->sched), r->planner, below[k], n[k], dear_coll_op_short((dear_coll_op_t)k),
               l->pt_bytes[0], pen[k] * 1e3);
        if (b)
            printf("; %d within the %d-in-flight burst curve (<= %.0f B), priced by it when queued", burst[k],
                   model->burst_k, b->pt_bytes[b->npts - 1]);
        else
            printf("; no burst curve: queued ones priced as alone");
        const dear_cost_line_t *il = dear_cost_idle(model, (dear_coll_op_t)k);
        if (il)
            printf("; %d above the idle curve's smallest size (%.0f B), priced by its slope when the link was idle "
                   "%g ms\n",
                   idle[k], il->pt_bytes[0], 1e3 * DEAR_COST_IDLE_GAP_S);
        else
            printf("; no idle curve: one on an idle link priced back to back\n");
    }
    dear_sim_result_free(&res);
}

/* --svg and --plan-out: of the fastest row shown. 0, or 1 when a file could not be written. */
static int write_best(const plan_opts_t *o, const model_t *mu, const dear_cost_model_t *model, int P,
                      const table_t *tab)
{
    int best = 0, status = 0;
    for (int i = 1; i < tab->nrows; i++)
        if (tab->rows[i].iter < tab->rows[best].iter)
            best = i;
    if (tab->nrows > 0 && !o->csv)
        print_measured_range(mu, model, o, &tab->rows[best]);
    if (tab->nrows == 0 || !(o->svg || o->plan_out))
        return 0;
    const row_t *r = &tab->rows[best];
    if (!o->csv)
        printf("\nbest shown: %s + %s, %.3f ms\n", dear_sched_name(r->sched), r->planner, r->iter * 1e3);
    if (o->svg && write_svg(o, mu, model, P, r) != 0)
        status = 1;
    if (o->plan_out && write_plan(o->plan_out, mu, r) != 0)
        status = 1;
    return status;
}

/* One line of the scaling table: the references and the best wfbp and dear rows at q workers,
 * the cost model scaled from P. 0, or 1 when the model or the planning failed. */
static int print_scaled(const plan_opts_t *o, const model_t *mu, int P, long q)
{
    dear_cost_model_t m2;
    if (make_model(&o->src, (int)q, P, &m2) != DEAR_OK)
        return 1;
    table_t tab;
    if (evaluate(mu, &m2, o, -1, &tab) != DEAR_OK)
        return 1;
    const row_t *r2 = tab.rows;
    int bw = -1, bd = -1;
    for (int i = 0; i < tab.nrows; i++) {
        if (r2[i].sched == DEAR_SCHED_WFBP && (bw < 0 || r2[i].iter < r2[bw].iter))
            bw = i;
        if (r2[i].sched == DEAR_SCHED_DEAR && (bd < 0 || r2[i].iter < r2[bd].iter))
            bd = i;
    }
    double ts = tab.t_sync, tw = tab.t_wthr, tdt = tab.t_dthr;
    double other = ts;
    if (bw >= 0 && r2[bw].iter < other)
        other = r2[bw].iter;
    if (o->csv)
        printf("%ld,%.4f,%.4f,%.4f,%s,%.4f,%.4f,%s\n", q, ts * 1e3, tw * 1e3, bw >= 0 ? r2[bw].iter * 1e3 : NAN,
               bw >= 0 ? r2[bw].planner : "-", tdt * 1e3, bd >= 0 ? r2[bd].iter * 1e3 : NAN,
               bd >= 0 ? r2[bd].planner : "-");
    else
        printf("%7ld %10.3f %10.3f %8.3f %-8s %10.3f %8.3f %-8s %7.1f%%\n", q, ts * 1e3, tw * 1e3,
               bw >= 0 ? r2[bw].iter * 1e3 : NAN, bw >= 0 ? r2[bw].planner : "-", tdt * 1e3,
               bd >= 0 ? r2[bd].iter * 1e3 : NAN, bd >= 0 ? r2[bd].planner : "-",
               bd >= 0 ? 100 * (other / r2[bd].iter - 1) : NAN);
    table_free(&tab);
    return 0;
}

/* --scale: the best times at each listed worker count. 0, 1 when one failed, 2 for a bad entry. */
static int print_scaling(const plan_opts_t *o, const model_t *mu, const dear_cost_model_t *model, int P)
{
    int status = 0;
    if (!o->csv)
        printf("\nscaling (%s; ring model: alpha ~ P-1, beta ~ 2(P-1)/P)\n%7s %10s %10s %-17s %10s %-17s %8s\n",
               model->source, "workers", "sync_ms", "wfbp_th_ms", "best_wfbp", "dear_th_ms", "best_dear", "gain");
    else
        printf("scale_workers,sync_ms,wfbp_threshold_ms,best_wfbp_ms,best_wfbp_planner,dear_threshold_ms,"
               "best_dear_ms,best_dear_planner\n");
    char *list = strdup(o->scale);
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        long q;
        if (dear_text_long(tok, 2, 1 << 24, &q)) {
            fprintf(stderr, "dear-plan: --scale entry '%s' is not an integer >= 2\n", tok);
            status = 2;
            break;
        }
        if ((status = print_scaled(o, mu, P, q)) != 0)
            break;
    }
    free(list);
    return status;
}

/* --hints: the layers' compute hints from a model description, matched by layer id. 0, or 2. */
static int apply_hints(const char *path, dear_profile_t *prof)
{
    dear_profile_t h = { 0 };
    if (dear_prof_load(path, &h) != DEAR_OK) {
        fprintf(stderr, "dear-plan: cannot use --hints %s (see the error above)\n", path);
        return 2;
    }
    int status = 0;
    for (int k = 0; k < h.nlayers && status == 0; k++) {
        int l = 0;
        while (l < prof->nlayers && prof->layers[l].id != h.layers[k].id)
            l++;
        if (l == prof->nlayers) {
            fprintf(stderr, "dear-plan: --hints %s: layer %d is not a layer of the profile\n", path, h.layers[k].id);
            status = 2;
        } else if (h.layers[k].flops >= 0) {
            prof->layers[l].flops = h.layers[k].flops;
        }
    }
    dear_prof_free(&h);
    return status;
}

/* The profile (or description) of --profile into mu: hints applied, the estimate made when
 * asked (a description is always estimated, and its times are the estimate's), both cut into
 * the same units. 0, or the exit status (said on stderr). */
static int load_model(plan_opts_t *o, const dear_cost_model_t *model, model_t *mu)
{
    int rc;
    if (dear_prof_load(o->profile, &mu->tensors) != DEAR_OK) {
        fprintf(stderr, "dear-plan: cannot use profile %s (see the error above)\n", o->profile);
        return 1;
    }
    for (int t = 0; o->dense && t < mu->tensors.ntensors; t++)
        mu->tensors.tensors[t].block_bytes = 0;
    dear_prof_set_compress(&mu->tensors, -1, o->comp_rs, o->comp_ag);
    mu->timed = !mu->tensors.no_times;
    if (!mu->timed && !o->estimate)
        o->estimate = EST_RANGE;
    if (o->hints && apply_hints(o->hints, &mu->tensors) != 0)
        return 2;
    if (o->compute_ms > 0 && mu->timed)
        fprintf(stderr, "dear-plan: note: --compute-ms is for a model description; the profile's times hold\n");
    dear_profile_t est = { 0 };
    if (o->estimate) {
        /* The totals: the profile's, else --compute-ms, else compute = communication. */
        double F = dear_prof_fwd_total(&mu->tensors), B = dear_prof_bwd_total(&mu->tensors);
        if (!mu->timed) {
            double T = o->compute_ms * 1e-3;
            if (!(T > 0)) {
                dear_sim_model_arg_t marg;
                dear_plan_problem_t prob;
                rc = dear_plan_problem_init(&prob, &mu->tensors, DEAR_SCHED_DEAR, model, 0, &marg);
                T = rc == DEAR_OK ? dear_estimate_comm_s(&prob, &mu->tensors) : NAN;
            }
            F = T / 3, B = 2 * T / 3;
        }
        if ((rc = dear_prof_estimate(&mu->tensors, F, B, &est)) != DEAR_OK) {
            fprintf(stderr, "dear-plan: cannot estimate the compute of %s: %s\n", o->profile, dear_status_string(rc));
            return 1;
        }
        if (!mu->timed) {
            dear_prof_free(&mu->tensors);
            mu->tensors = est;
            est = (dear_profile_t){ 0 };
            rc = dear_prof_units(&mu->tensors, mu->tensors.ntensors, NULL, &est); /* a copy */
        }
    }
    /* The estimate's profile too travels compressed. */
    dear_prof_set_compress(&mu->tensors, -1, o->comp_rs, o->comp_ag);
    rc = dear_prof_cut(&mu->tensors, (size_t)o->partition, &mu->units, &mu->nunits, &mu->prof);
    if (rc == DEAR_OK && o->estimate)
        rc = dear_prof_units(&est, mu->nunits, mu->units, &mu->est);
    dear_prof_free(&est);
    if (rc != DEAR_OK) {
        fprintf(stderr, "dear-plan: cannot cut the tensors at --partition %lld: %s\n", o->partition,
                dear_status_string(rc));
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    plan_opts_t o;
    int rc = parse_args(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    int P = (int)o.workers;
    model_t mu = { 0 };
    dear_cost_model_t model;
    if ((rc = make_model(&o.src, P, P, &model)) != DEAR_OK) {
        fprintf(stderr, "dear-plan: no cost model: %s\n", dear_status_string(rc));
        return 2;
    }
    if ((rc = load_model(&o, &model, &mu)) != 0) {
        model_free(&mu);
        return rc;
    }
    table_t tab;
    if ((rc = evaluate(&mu, &model, &o, o.sched_sel, &tab)) != DEAR_OK) {
        fprintf(stderr, "dear-plan: planning failed: %s\n", dear_status_string(rc));
        model_free(&mu);
        return 1;
    }
    if (o.csv)
        print_csv(&mu, &o, P, &tab);
    else
        print_table(o.profile, &mu, &o, &model, &tab);
    if (!o.csv && o.estimate)
        print_start(&o, &tab);
    int status = write_best(&o, &mu, &model, P, &tab);
    table_free(&tab);
    if (o.scale && status == 0)
        status = print_scaling(&o, &mu, &model, P);
    model_free(&mu);
    return status;
}

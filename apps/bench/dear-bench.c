/*
 * dear-bench: the profile-driven benchmark driver (issue 6). It loads a model profile
 * (docs/FORMATS.md), allocates real float32 gradient and parameter buffers of the profiled sizes
 * in one arena each, emulates every layer's forward and backward compute by sleeping for its
 * profiled time x --time-scale (sleeping, not spinning, so the cores stay free for the progress
 * threads), and drives the runtime through the public hooks and update callbacks exactly as a
 * trainer would. The gradients are deterministic functions of rank, iteration and element, and
 * the update is plain SGD, so after every configuration the parameters are checked twice: all
 * ranks must hold the same bytes, and sampled elements must match a float64 recomputation of
 * the whole run from the closed form of the gradients. For each configuration (schedule,
 * planner, threshold) it prints the median iteration time, exposed communication, blocked time,
 * speedups over sync and over wfbp+threshold 64 MiB, the simulator's prediction (fusion/sim.h)
 * under a cost model, and the lower bound of issue 6. Profile and prediction come from the
 * fusion library's pure functions; everything the runtime does goes through include/dear.h.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include "fusion/cost.h"
#include "fusion/planfile.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "fusion/sim.h"
#include "fusion/textio.h"
#include "include/dear.h"

#define MAX_CONFIGS 32
#define DEFAULT_CONFIGS "sync;wfbp:threshold:64m;wfbp:threshold:25m;wfbp:mgwfbp;dear:threshold:25m;dear:gradssa;dear:auto"
#define LR 0.05f
#define GRAD_PERIOD 17u         /* gradients cycle through 17 values: sums stay exact in float64 */
#define SAMPLE_TARGET 100000    /* elements recomputed in float64 per configuration */
#define REF64M ((size_t)64 << 20)

typedef struct {
    char text[64];              /* as given, e.g. "wfbp:threshold:64m" */
    char sched[8];              /* dear|wfbp|sync */
    char fusion[16];            /* planner; "one" for sync */
    size_t threshold;           /* bytes, before --size-scale */
    int warmup;                 /* iterations before measuring (per round) */
} config_t;

typedef struct {
    const char *profile, *csv, *preset, *calibration, *svg_dir;
    double time_scale, size_scale, alpha, beta;
    int have_ab, iters, warmup, quiet;
    int rounds;                 /* the configuration list runs this many times, iters split over them */
    int fault;                  /* hidden: 1 perturbs one rank's gradient, 2 one rank's parameters */
    int nconfigs;
    config_t configs[MAX_CONFIGS];
} opts_t;

typedef struct {
    int ok_run;                 /* the runtime accepted and ran the configuration */
    int check_ok;
    double iter_s, iter_min_s, iter_max_s, compute_s, blocked_s, pred_s;
    double iter_q1_s, iter_q3_s;  /* quartiles of the measured iterations: the run-to-run noise */
    char status[96];
    dear_plan_t plan;           /* rank 0: the plan the runtime ran last (dear_plan_save); empty if unknown */
    /* accumulated over the rounds, then summarised by result_finish */
    double *samples, *comp;     /* slowest rank's measured iterations and their compute */
    int nsamples;
    double blocked_sum;         /* per-iteration blocked time, summed over rounds */
    int nrounds;
} result_t;

/* One tensor's update: SGD on its parameters, counted so a missing or repeated call is caught. */
typedef struct {
    float *param;
    long calls;
} upd_arg_t;

static int g_rank, g_size;

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
    if (g_rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    if (g_rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "dear-bench: ");
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, " (try --help)\n");
    }
    return 2;
}

static void usage(void)
{
    say("usage: mpirun -np P dear-bench --profile FILE [options]\n"
        "Emulate a model's compute from its profile (sleeping), synchronise real float32 gradients\n"
        "through libdear, check the parameters, and compare measured iteration times with the\n"
        "simulator's prediction for each configuration.\n"
        "\n"
        "  --profile FILE       model profile (docs/FORMATS.md; fusion/profiles/ ships five)\n"
        "  --configs LIST       configurations run one after another, ';' or ',' separated, each\n"
        "                       SCHEDULE[:PLANNER[:THRESHOLD]], e.g.\n"
        "                       \"%s\"\n"
        "                       (SCHEDULE dear|wfbp|sync; PLANNER none|threshold|mgwfbp|dp|gradssa|auto;\n"
        "                       THRESHOLD bytes with k/m/g = KiB/MiB/GiB, default 25m)\n"
        "  --schedule S, --fusion X, --threshold BYTES\n"
        "                       one configuration (default: DEAR_SCHEDULE, DEAR_FUSION,\n"
        "                       DEAR_FUSION_THRESHOLD, else dear, threshold, 25m); not with --configs\n"
        "  --iters N            measured iterations per configuration (default 20)\n"
        "  --rounds R           run the configuration list R times, N/R measured iterations each,\n"
        "                       and pool them (default 1): a stall of the machine then hits a part\n"
        "                       of several configurations rather than one whole\n"
        "  --warmup N           iterations before measuring, in every run (default per planner:\n"
        "                       none/threshold/sync 3; mgwfbp/dp/gradssa DEAR_WARMUP_ITERS + 2;\n"
        "                       auto also waits for its check, DEAR_WARMUP_ITERS + 1 +\n"
        "                       DEAR_VERIFY_ITERS + 2 = 12)\n"
        "  --time-scale X       multiply every profiled compute time by X (default 1)\n"
        "  --size-scale X       multiply every tensor size by X (default 1; thresholds scale too,\n"
        "                       so the bucketing matches the full-size model)\n"
        "  --preset NAME        cost model for predictions: %s\n"
        "  --alpha A --beta B   cost model: all-reduce start-up (s) and per-byte time (s/B)\n"
        "  --calibration FILE   cost model: a calibration cache (DEAR_CALIBRATION_FILE format)\n"
        "                       entry for this communicator size and ranks per host\n"
        "                       (default: the model the runtime itself calibrated during the runs,\n"
        "                       through DEAR_CALIBRATION_FILE, a temporary file unless it is set;\n"
        "                       when no configuration calibrated, a quick fit of MPI's collectives)\n"
        "  --csv FILE           also write the results as CSV (rank 0)\n"
        "  --svg-dir DIR        write the predicted Gantt chart of each configuration there\n"
        "  --quiet              only the result table\n"
        "DEAR_STALL_ABORT_S defaults to 120 here, so a broken run ends instead of hanging.\n"
        "  --help               this text\n"
        "Exit status: 0 all configurations ran and passed the parameter check; 1 a check failed or\n"
        "the run broke; 2 bad arguments or profile; 3 the runtime refused a configuration.\n",
        DEFAULT_CONFIGS, dear_cost_preset_names());
}

static int parse_int(const char *s, long lo, long hi, int *v)
{
    long x;
    if (dear_text_long(s, lo, hi, &x) != 0)
        return -1;
    *v = (int)x;
    return 0;
}

/* Bytes with an optional k/m/g suffix (KiB, MiB, GiB), as DEAR_FUSION_THRESHOLD accepts. */
static int parse_size(const char *s, size_t *v)
{
    char *e;
    errno = 0;
    unsigned long long x = strtoull(s, &e, 10);
    if (errno || e == s || s[0] == '-')
        return -1;
    unsigned long long mul = 1;
    if (*e == 'k' || *e == 'K')
        mul = 1ull << 10, e++;
    else if (*e == 'm' || *e == 'M')
        mul = 1ull << 20, e++;
    else if (*e == 'g' || *e == 'G')
        mul = 1ull << 30, e++;
    if (*e || x == 0 || x > (1ull << 50) / mul)
        return -1;
    *v = (size_t)(x * mul);
    return 0;
}

static int valid_sched(const char *s)
{
    return !strcmp(s, "dear") || !strcmp(s, "wfbp") || !strcmp(s, "sync");
}

static int valid_planner(const char *s)
{
    static const char *const names[] = { "none", "threshold", "mgwfbp", "dp", "gradssa", "auto" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i]))
            return 1;
    return 0;
}

static int make_config(config_t *c, const char *text, const char *sched, const char *fusion, size_t threshold)
{
    if (!valid_sched(sched))
        return usage_error("configuration '%s': schedule '%s' is not one of dear|wfbp|sync", text, sched);
    if (strcmp(sched, "sync") != 0 && !valid_planner(fusion))
        return usage_error("configuration '%s': planner '%s' is not one of none|threshold|mgwfbp|dp|gradssa|auto",
                           text, fusion);
    snprintf(c->text, sizeof c->text, "%s", text);
    snprintf(c->sched, sizeof c->sched, "%s", sched);
    snprintf(c->fusion, sizeof c->fusion, "%s", strcmp(sched, "sync") ? fusion : "one");
    c->threshold = threshold;
    return 0;
}

static int parse_configs(const char *list, opts_t *o)
{
    char *dup = strdup(list), *save = NULL;
    if (!dup)
        return usage_error("out of memory");
    int rc = 0;
    o->nconfigs = 0;
    for (char *tok = strtok_r(dup, ";,", &save); tok && !rc; tok = strtok_r(NULL, ";,", &save)) {
        while (*tok == ' ')
            tok++;
        if (!*tok)
            continue;
        if (o->nconfigs == MAX_CONFIGS) {
            rc = usage_error("--configs: more than %d configurations", MAX_CONFIGS);
            break;
        }
        if (strlen(tok) >= sizeof o->configs[0].text) {
            rc = usage_error("--configs: '%s' is too long", tok);
            break;
        }
        char buf[64], *f[4] = { 0 };
        int nf = 0;
        snprintf(buf, sizeof buf, "%s", tok);
        for (char *p = buf, *q; nf < 4 && p; p = q) {
            q = strchr(p, ':');
            if (q)
                *q++ = 0;
            f[nf++] = p;
        }
        size_t thr = (size_t)25 << 20;
        if (nf > 3 || (f[2] && parse_size(f[2], &thr))) {
            rc = usage_error("--configs: '%s' is not SCHEDULE[:PLANNER[:THRESHOLD]] (threshold: bytes, k/m/g "
                             "suffix)",
                             tok);
            break;
        }
        rc = make_config(&o->configs[o->nconfigs], tok, f[0], f[1] ? f[1] : "threshold", thr);
        if (!rc)
            o->nconfigs++;
    }
    free(dup);
    if (!rc && o->nconfigs == 0)
        rc = usage_error("--configs '%s' names no configuration", list);
    return rc;
}

static int parse_single(opts_t *o, const char *sched, const char *fusion, const char *thr_text);

static int parse_args(int argc, char **argv, opts_t *o)
{
    static const struct option lopts[] = {
        { "profile", required_argument, 0, 'f' },     { "configs", required_argument, 0, 'C' },
        { "schedule", required_argument, 0, 's' },    { "fusion", required_argument, 0, 'x' },
        { "threshold", required_argument, 0, 't' },   { "iters", required_argument, 0, 'n' },
        { "warmup", required_argument, 0, 'w' },      { "time-scale", required_argument, 0, 'T' },
        { "size-scale", required_argument, 0, 'S' },  { "preset", required_argument, 0, 'p' },
        { "alpha", required_argument, 0, 'a' },       { "beta", required_argument, 0, 'b' },
        { "calibration", required_argument, 0, 'c' }, { "csv", required_argument, 0, 'o' },
        { "svg-dir", required_argument, 0, 'g' },     { "quiet", no_argument, 0, 'q' },
        { "inject-fault", required_argument, 0, 'F' }, { "help", no_argument, 0, 'h' },
        { "rounds", required_argument, 0, 'R' },
        { 0, 0, 0, 0 }
    };
    const char *configs = NULL, *sched = NULL, *fusion = NULL, *thr_text = NULL;
    int have_a = 0, have_b = 0, c;
    o->iters = 20;
    o->warmup = -1;
    o->rounds = 1;
    o->time_scale = o->size_scale = 1.0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
        switch (c) {
        case 'f': o->profile = optarg; break;
        case 'C': configs = optarg; break;
        case 's': sched = optarg; break;
        case 'x': fusion = optarg; break;
        case 't': thr_text = optarg; break;
        case 'n':
            if (parse_int(optarg, 1, 1000000, &o->iters))
                return usage_error("--iters '%s' is not an integer in [1, 1000000]", optarg);
            break;
        case 'w':
            if (parse_int(optarg, 0, 1000000, &o->warmup))
                return usage_error("--warmup '%s' is not an integer in [0, 1000000]", optarg);
            break;
        case 'R':
            if (parse_int(optarg, 1, 1000, &o->rounds))
                return usage_error("--rounds '%s' is not an integer in [1, 1000]", optarg);
            break;
        case 'T':
            if (dear_text_double(optarg, 0, HUGE_VAL, &o->time_scale) || o->time_scale > 1e6)
                return usage_error("--time-scale '%s' is not a number in [0, 1e6]", optarg);
            break;
        case 'S':
            if (dear_text_double(optarg, 0, HUGE_VAL, &o->size_scale) || o->size_scale <= 0 || o->size_scale > 1e3)
                return usage_error("--size-scale '%s' is not a number in (0, 1000]", optarg);
            break;
        case 'p': o->preset = optarg; break;
        case 'a':
            if (dear_text_double(optarg, 0, HUGE_VAL, &o->alpha))
                return usage_error("--alpha '%s' is not a time in seconds >= 0", optarg);
            have_a = 1;
            break;
        case 'b':
            if (dear_text_double(optarg, 0, HUGE_VAL, &o->beta))
                return usage_error("--beta '%s' is not a time per byte in seconds >= 0", optarg);
            have_b = 1;
            break;
        case 'c': o->calibration = optarg; break;
        case 'o': o->csv = optarg; break;
        case 'g': o->svg_dir = optarg; break;
        case 'q': o->quiet = 1; break;
        case 'F':
            if (!strcmp(optarg, "grad"))
                o->fault = 1;
            else if (!strcmp(optarg, "param"))
                o->fault = 2;
            else
                return usage_error("--inject-fault '%s' is not one of grad|param", optarg);
            break;
        case 'h': usage(); return -1;
        default: return usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (!o->profile)
        return usage_error("--profile FILE is required");
    o->have_ab = have_a || have_b;
    if (o->have_ab && !(have_a && have_b))
        return usage_error("--alpha and --beta go together");
    if ((o->preset != NULL) + o->have_ab + (o->calibration != NULL) > 1)
        return usage_error("give at most one cost model: --preset, --alpha/--beta or --calibration");
    if (o->preset) {
        dear_cost_model_t m;
        if (dear_cost_preset(o->preset, 2, 1, &m) != DEAR_OK)
            return usage_error("--preset '%s' is not one of %s", o->preset, dear_cost_preset_names());
    }
    /* The runtime plans after DEAR_WARMUP_ITERS and (auto) checks the plan by timing
     * DEAR_VERIFY_ITERS more after the first on it; the measured iterations start after both. */
    int rt_warm = 5, rt_verify = 4;
    const char *env_w = getenv("DEAR_WARMUP_ITERS"), *env_v = getenv("DEAR_VERIFY_ITERS");
    if (env_w && parse_int(env_w, 1, 1000000, &rt_warm))
        rt_warm = 5; /* the runtime reports the bad value itself at dear_init */
    if (env_v && parse_int(env_v, 0, 1000000, &rt_verify))
        rt_verify = 4;
    int settled = rt_warm + (rt_verify > 0 ? 1 + rt_verify : 0);
    if (o->warmup >= 0 && o->warmup <= settled && !o->quiet)
        say("dear-bench: note: --warmup %d <= %d (DEAR_WARMUP_ITERS %d, then DEAR_VERIFY_ITERS %d after one): "
            "measured iterations of auto may include the runtime's own warm-up, planning and check\n",
            o->warmup, settled, rt_warm, rt_verify);
    if (o->rounds > o->iters)
        return usage_error("--rounds %d exceeds --iters %d: every round measures at least one iteration", o->rounds,
                           o->iters);
    int rc;
    if (configs) {
        if (sched || fusion || thr_text)
            return usage_error("--configs cannot be combined with --schedule, --fusion or --threshold");
        rc = parse_configs(configs, o);
    } else {
        rc = parse_single(o, sched, fusion, thr_text);
    }
    /* Warm-up per configuration: what its plan needs before it is in place. */
    for (int i = 0; rc == 0 && i < o->nconfigs; i++) {
        config_t *cf = &o->configs[i];
        int fixed = !strcmp(cf->fusion, "none") || !strcmp(cf->fusion, "threshold") || !strcmp(cf->fusion, "one");
        cf->warmup = o->warmup >= 0 ? o->warmup
                     : fixed        ? 3
                     : !strcmp(cf->fusion, "auto") ? settled + 2
                                                   : rt_warm + 2;
    }
    return rc;
}

/* The configuration of --schedule/--fusion/--threshold (or the DEAR_* environment). */
static int parse_single(opts_t *o, const char *sched, const char *fusion, const char *thr_text)
{
    if (!sched)
        sched = getenv("DEAR_SCHEDULE") ? getenv("DEAR_SCHEDULE") : "dear";
    if (!fusion)
        fusion = getenv("DEAR_FUSION") ? getenv("DEAR_FUSION") : "threshold";
    if (!thr_text)
        thr_text = getenv("DEAR_FUSION_THRESHOLD") ? getenv("DEAR_FUSION_THRESHOLD") : "25m";
    size_t thr;
    if (parse_size(thr_text, &thr))
        return usage_error("threshold '%s' is not a size in bytes (k/m/g suffix allowed)", thr_text);
    char text[64];
    if (!strcmp(sched, "sync"))
        snprintf(text, sizeof text, "sync");
    else
        snprintf(text, sizeof text, "%.8s:%.15s:%.20s", sched, fusion, thr_text);
    o->nconfigs = 1;
    return make_config(&o->configs[0], text, sched, fusion, thr);
}

/* ---- the model: scaled profile, arenas, deterministic gradients ---- */

typedef struct {
    dear_profile_t prof;        /* scaled: times x time-scale, bytes x size-scale */
    size_t *off, *count;        /* per tensor, elements */
    size_t nelem;
    int *lfirst, *lcount;       /* tensors of each layer index */
    float *grad, *param;
    upd_arg_t *upd;
} model_t;

static const float g_tab[GRAD_PERIOD] = {
    -8.0f / 1024, -7.0f / 1024, -6.0f / 1024, -5.0f / 1024, -4.0f / 1024, -3.0f / 1024,
    -2.0f / 1024, -1.0f / 1024, 0.0f,         1.0f / 1024,  2.0f / 1024,  3.0f / 1024,
    4.0f / 1024,  5.0f / 1024,  6.0f / 1024,  7.0f / 1024,  8.0f / 1024
};

/* Gradient of global element e at iteration it on rank r: a period-17 sequence, cheap to write
 * and to sum in closed form; depends on all three so a misplaced element or rank shows. */
static unsigned grad_index(size_t e, long it, int r)
{
    return (unsigned)((7u * (e % GRAD_PERIOD) + 13u * ((unsigned long)it % GRAD_PERIOD) +
                       29u * ((unsigned)r % GRAD_PERIOD)) % GRAD_PERIOD);
}

static float param0(size_t e)
{
    return (float)((int)((3u * (e % 11u)) % 11u) - 5) * 0.125f;
}

static void fill_grad(model_t *m, int t, long it, int r, int fault)
{
    float *g = m->grad + m->off[t];
    unsigned k = grad_index(m->off[t], it, r);
    for (size_t i = 0; i < m->count[t]; i++) {
        g[i] = g_tab[k];
        k += 7;
        if (k >= GRAD_PERIOD)
            k -= GRAD_PERIOD;
    }
    if (fault && t == 0)
        for (size_t i = 0; i < m->count[t]; i++)
            g[i] += 0.5f;
}

static int update_sgd(void *grad, size_t count, dear_dtype_t dtype, void *arg)
{
    upd_arg_t *u = arg;
    const float *g = grad;
    if (dtype != DEAR_FLOAT32)
        return 1;
    for (size_t i = 0; i < count; i++)
        u->param[i] -= LR * g[i];
    u->calls++;
    return 0;
}

static void *alloc_arena(size_t nelem)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, nelem * sizeof(float) + 64) != 0)
        return NULL;
    return p;
}

static int model_build(const dear_profile_t *src, const opts_t *o, model_t *m)
{
    char msg[256];
    dear_prof_init(&m->prof, src->model);
    for (int l = 0; l < src->nlayers; l++)
        if (dear_prof_add_layer(&m->prof, src->layers[l].id, src->layers[l].fwd_s * o->time_scale,
                                src->layers[l].bwd_s * o->time_scale) != DEAR_OK)
            return DEAR_ERR_NOMEM;
    for (int t = 0; t < src->ntensors; t++) {
        double el = floor((double)src->tensors[t].bytes / sizeof(float) * o->size_scale + 0.5);
        size_t n = el < 1 ? 1 : (size_t)el;
        if (dear_prof_add_tensor(&m->prof, src->tensors[t].name, src->tensors[t].layer, n * sizeof(float)) != DEAR_OK)
            return DEAR_ERR_NOMEM;
    }
    if (dear_prof_check(&m->prof, msg, sizeof msg) != DEAR_OK) {
        if (g_rank == 0)
            fprintf(stderr, "dear-bench: scaled profile is invalid: %s\n", msg);
        return DEAR_ERR_FORMAT;
    }
    int nt = m->prof.ntensors, nl = m->prof.nlayers;
    m->off = calloc((size_t)nt, sizeof(size_t));
    m->count = calloc((size_t)nt, sizeof(size_t));
    m->upd = calloc((size_t)nt, sizeof(upd_arg_t));
    m->lfirst = calloc((size_t)nl, sizeof(int));
    m->lcount = calloc((size_t)nl, sizeof(int));
    if (!m->off || !m->count || !m->upd || !m->lfirst || !m->lcount)
        return DEAR_ERR_NOMEM;
    for (int t = 0; t < nt; t++) {
        m->off[t] = m->nelem;
        m->count[t] = m->prof.tensors[t].bytes / sizeof(float);
        m->nelem += m->count[t];
        int l = m->prof.tensors[t].lidx;
        if (m->lcount[l]++ == 0)
            m->lfirst[l] = t;
    }
    m->grad = alloc_arena(m->nelem);
    m->param = alloc_arena(m->nelem);
    if (!m->grad || !m->param) {
        fprintf(stderr, "dear-bench: rank %d: cannot allocate 2 x %.1f MiB for gradients and parameters "
                        "(use --size-scale to shrink the model)\n",
                g_rank, m->nelem * 4.0 / 1048576);
        return DEAR_ERR_NOMEM;
    }
    for (int t = 0; t < nt; t++)
        m->upd[t].param = m->param + m->off[t];
    return DEAR_OK;
}

static void model_free(model_t *m)
{
    free(m->off);
    free(m->count);
    free(m->upd);
    free(m->lfirst);
    free(m->lcount);
    free(m->grad);
    free(m->param);
    dear_prof_free(&m->prof);
}

/* ---- compute emulation ---- */

/* Sleep until start + target (absolute deadline, so a signal does not stretch it). */
static void sleep_until(const struct timespec *start, double target)
{
    if (target <= 0)
        return;
    struct timespec d = *start;
    double s = floor(target);
    d.tv_sec += (time_t)s;
    d.tv_nsec += (long)((target - s) * 1e9);
    if (d.tv_nsec >= 1000000000L) {
        d.tv_sec++;
        d.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &d, NULL) == EINTR)
        ;
}

static double ts_diff(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + (double)(b->tv_nsec - a->tv_nsec) * 1e-9;
}

/* Emulated compute of `want` seconds, part of which may already be spent writing gradients.
 * *late carries oversleep across the layers of one iteration: nanosleep overshoots by tens of
 * microseconds, which over hundreds of layers would inflate compute by several percent. */
static void compute(const struct timespec *start, double want, double *late)
{
    struct timespec now;
    sleep_until(start, want - *late);
    clock_gettime(CLOCK_MONOTONIC, &now);
    *late += ts_diff(start, &now) - want;
    if (*late < -1e-3)
        *late = -1e-3; /* a very slow gradient fill is not paid back by sleeping more later */
}

/* ---- one configuration ---- */

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Quantile q of v[0..n) by linear interpolation between order statistics; sorts v. */
static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    double x = q * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

static double median(double *v, int n)
{
    return quantile(v, n, 0.5);
}

static size_t scaled_threshold(const config_t *c, const opts_t *o)
{
    double t = floor((double)c->threshold * o->size_scale + 0.5);
    return t < 1 ? 1 : (size_t)t;
}

static int set_env(const config_t *c, const opts_t *o)
{
    char thr[32];
    snprintf(thr, sizeof thr, "%zu", scaled_threshold(c, o));
    if (setenv("DEAR_SCHEDULE", c->sched, 1) || setenv("DEAR_FUSION_THRESHOLD", thr, 1) ||
        setenv("DEAR_FUSION", strcmp(c->fusion, "one") ? c->fusion : "threshold", 1))
        return DEAR_ERR_NOMEM;
    return DEAR_OK;
}

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Every rank: same bytes as rank 0? Sampled elements equal to the float64 recomputation?
 * Each tensor updated exactly once per iteration? Returns 1 when all hold on every rank. */
static int check_params(model_t *m, long total_iters, char *why, size_t whylen)
{
    int bad_calls = 0;
    for (int t = 0; t < m->prof.ntensors; t++)
        if (m->upd[t].calls != total_iters) {
            if (!bad_calls)
                fprintf(stderr, "dear-bench: rank %d: tensor %s updated %ld times, expected %ld\n", g_rank,
                        m->prof.tensors[t].name, m->upd[t].calls, total_iters);
            bad_calls++;
        }
    uint64_t h = fnv1a(m->param, m->nelem * sizeof(float)), h0 = h;
    MPI_Bcast(&h0, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    int differs = h != h0;

    /* Closed form: sum over iterations and ranks of the period-17 sequence, in float64. */
    size_t stride = m->nelem / SAMPLE_TARGET + 1;
    double tol = 4e-7 * (double)(total_iters + 8), worst = 0, worst_ref = 0;
    size_t worst_e = 0, nbad = 0;
    for (int t = 0; t < m->prof.ntensors; t++) {
        size_t n = m->count[t];
        for (size_t i = 0;; i = i + stride < n ? i + stride : n - 1) {
            size_t e = m->off[t] + i;
            double sum = 0;
            for (long it = 0; it < total_iters; it++)
                for (int r = 0; r < g_size; r++)
                    sum += g_tab[grad_index(e, it, r)];
            double ref = (double)param0(e) - (double)LR * sum / g_size;
            double err = fabs((double)m->param[e] - ref);
            if (err > worst)
                worst = err, worst_e = e, worst_ref = ref;
            if (err > tol)
                nbad++;
            if (i == n - 1)
                break;
        }
    }
    /* Every rank sees a mismatch of the shared result: rank 0 tells it, others only their own. */
    if (nbad && (g_rank == 0 || differs))
        fprintf(stderr,
                "dear-bench: rank %d: %zu sampled parameters differ from the float64 reference by more than "
                "%.2g; worst element %zu: %.9g, expected %.9g\n",
                g_rank, nbad, tol, worst_e, (double)m->param[worst_e], worst_ref);
    int local[3] = { bad_calls > 0, differs, nbad > 0 }, all[3];
    MPI_Allreduce(local, all, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    snprintf(why, whylen, "%s%s%s", all[0] ? "update-count " : "", all[1] ? "ranks-differ " : "",
             all[2] ? "reference-mismatch" : "");
    return !(all[0] || all[1] || all[2]);
}

#define RT_CHECK(call)                                                                                       \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_ != DEAR_OK) {                                                                                \
            fprintf(stderr, "dear-bench: rank %d: %s failed: %s\n", g_rank, #call, dear_status_string(rc_)); \
            return rc_;                                                                                      \
        }                                                                                                    \
    } while (0)

/* One iteration: forward in layer order, backward in reverse, exactly the trainer's sequence. */
static int iterate(dear_ctx_t *ctx, model_t *m, long it, int fault, double *compute_s)
{
    const dear_profile_t *p = &m->prof;
    double late = 0, comp = 0;
    struct timespec s, e;
    for (int l = 0; l < p->nlayers; l++) {
        if (m->lcount[l])
            RT_CHECK(dear_forward_begin(ctx, p->layers[l].id));
        clock_gettime(CLOCK_MONOTONIC, &s);
        compute(&s, p->layers[l].fwd_s, &late);
        clock_gettime(CLOCK_MONOTONIC, &e);
        comp += ts_diff(&s, &e);
    }
    for (int l = p->nlayers - 1; l >= 0; l--) {
        clock_gettime(CLOCK_MONOTONIC, &s);
        for (int t = m->lfirst[l]; t < m->lfirst[l] + m->lcount[l]; t++)
            fill_grad(m, t, it, g_rank, fault);
        compute(&s, p->layers[l].bwd_s, &late);
        clock_gettime(CLOCK_MONOTONIC, &e);
        comp += ts_diff(&s, &e);
        if (m->lcount[l])
            RT_CHECK(dear_backward_done(ctx, p->layers[l].id));
    }
    RT_CHECK(dear_backward_end(ctx));
    *compute_s = comp;
    return DEAR_OK;
}

/* Rank 0: what the runtime ran, read back through a plan file, so the prediction simulates
 * that plan (auto may have kept the warm-up plan after timing its own). Best effort: without
 * it the prediction plans the configuration itself. */
static void keep_plan(dear_ctx_t *ctx, const model_t *m, result_t *res)
{
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/dear-bench-plan-XXXXXX", dir && dir[0] ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0)
        return;
    close(fd);
    if (dear_plan_save(ctx, path) != DEAR_OK ||
        dear_planfile_load(path, m->prof.ntensors, NULL, NULL, &res->plan) != DEAR_OK)
        dear_plan_free(&res->plan);
    unlink(path);
}

/* Run one configuration from fresh parameters: init, register, commit, warm-up + measured
 * iterations (iters), flush, finalize, then the parameter check; the measured iterations are
 * added to res (zeroed by the caller before the first round). Collective. */
static int run_config(const config_t *c, const opts_t *o, int iters, model_t *m, result_t *res)
{
    int nt = m->prof.ntensors, warmup = c->warmup, total = warmup + iters;
    for (size_t e = 0; e < m->nelem; e++)
        m->param[e] = param0(e);
    for (int t = 0; t < nt; t++)
        m->upd[t].calls = 0;
    if (set_env(c, o) != DEAR_OK)
        return DEAR_ERR_NOMEM;

    dear_ctx_t *ctx = NULL;
    int rc = dear_init(MPI_COMM_WORLD, &ctx);
    for (int t = 0; rc == DEAR_OK && t < nt; t++)
        rc = dear_register(ctx, m->prof.tensors[t].name, m->prof.tensors[t].layer, m->grad + m->off[t], m->count[t],
                           DEAR_FLOAT32, DEAR_MEM_HOST, update_sgd, &m->upd[t]);
    if (rc == DEAR_OK)
        rc = dear_commit(ctx);
    if (rc != DEAR_OK) {
        /* Refusals (a planner not built, a bad DEAR_* value) are collective: every rank is here. */
        snprintf(res->status, sizeof res->status, "refused: %s", dear_status_string(rc));
        res->ok_run = 0;
        dear_finalize(ctx);
        return DEAR_OK;
    }
    double *it_s = calloc((size_t)total, sizeof(double)), *comp_s = calloc((size_t)total, sizeof(double));
    double *it_max = calloc((size_t)total, sizeof(double)), *comp_max = calloc((size_t)total, sizeof(double));
    if (!it_s || !comp_s || !it_max || !comp_max) {
        rc = DEAR_ERR_NOMEM;
        goto out;
    }
    dear_stats_t st0 = { 0 }, st1 = { 0 };
    for (long it = 0; it < total && rc == DEAR_OK; it++) {
        if (it == warmup)
            rc = dear_get_stats(ctx, &st0);
        int fault = o->fault == 1 && g_rank == g_size - 1 && it == total / 2;
        double t0 = MPI_Wtime();
        if (rc == DEAR_OK)
            rc = iterate(ctx, m, it, fault, &comp_s[it]);
        it_s[it] = MPI_Wtime() - t0;
    }
    if (rc == DEAR_OK)
        rc = dear_get_stats(ctx, &st1);
    if (rc == DEAR_OK)
        rc = dear_flush(ctx);
    if (rc == DEAR_OK && g_rank == 0) {
        dear_plan_free(&res->plan);
        keep_plan(ctx, m, res);
    }
out:;
    int frc = dear_finalize(ctx);
    if (rc == DEAR_OK)
        rc = frc;
    /* A failure on one rank must not leave the others waiting in the next collective. */
    int local = rc != DEAR_OK, any;
    MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        snprintf(res->status, sizeof res->status, "run failed%s%s", local ? ": " : " on another rank",
                 local ? dear_status_string(rc) : "");
        free(it_s), free(comp_s), free(it_max), free(comp_max);
        return rc != DEAR_OK ? rc : DEAR_ERR_INTERNAL;
    }
    if (o->fault == 2 && g_rank == g_size - 1)
        m->param[m->nelem / 2] += 1e-3f;
    /* An iteration lasts as long as its slowest rank. */
    MPI_Allreduce(it_s, it_max, total, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(comp_s, comp_max, total, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double blocked = (st1.blocked_s - st0.blocked_s) / iters, blocked_max;
    MPI_Allreduce(&blocked, &blocked_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double *ns = realloc(res->samples, sizeof(double) * (size_t)(res->nsamples + iters));
    double *nc = ns ? realloc(res->comp, sizeof(double) * (size_t)(res->nsamples + iters)) : NULL;
    if (ns)
        res->samples = ns;
    if (nc)
        res->comp = nc;
    if (!ns || !nc) {
        free(it_s), free(comp_s), free(it_max), free(comp_max);
        return DEAR_ERR_NOMEM;
    }
    memcpy(res->samples + res->nsamples, it_max + warmup, sizeof(double) * (size_t)iters);
    memcpy(res->comp + res->nsamples, comp_max + warmup, sizeof(double) * (size_t)iters);
    res->nsamples += iters;
    res->blocked_sum += blocked_max;
    res->nrounds++;
    char why[96];
    int ok = check_params(m, total, why, sizeof why);
    if (res->nrounds == 1 || (res->check_ok && !ok)) {
        res->check_ok = ok;
        snprintf(res->status, sizeof res->status, "%s", ok ? "ok" : why);
    }
    res->ok_run = 1;
    free(it_s), free(comp_s), free(it_max), free(comp_max);
    return DEAR_OK;
}

/* The pooled measured iterations of every round: medians, quartiles, extremes. */
static void result_finish(result_t *res)
{
    if (!res->ok_run || res->nsamples == 0)
        return;
    double *v = res->samples; /* sorted in place by the quantiles */
    int n = res->nsamples;
    res->iter_min_s = res->iter_max_s = v[0];
    for (int i = 1; i < n; i++) {
        res->iter_min_s = fmin(res->iter_min_s, v[i]);
        res->iter_max_s = fmax(res->iter_max_s, v[i]);
    }
    res->iter_s = median(v, n);
    res->iter_q1_s = quantile(v, n, 0.25);
    res->iter_q3_s = quantile(v, n, 0.75);
    res->compute_s = median(res->comp, n);
    res->blocked_s = res->blocked_sum / res->nrounds;
}

/* ---- cost model and prediction ---- */

/* Default cost model: a quick least-squares fit of MPI's blocking collectives on this
 * communicator (three sizes, best of three). Sizes are those of typical buckets: below them
 * TCP latency effects make the line a poor fit where most bytes travel. The runtime's own
 * collectives may differ; the prediction error column says by how much. Collective. */
static int calibrate_mpi(size_t max_bytes, dear_cost_model_t *model)
{
    static const size_t sizes[] = { (size_t)256 << 10, (size_t)1 << 20, (size_t)4 << 20 };
    size_t cap = max_bytes < sizes[2] ? max_bytes : sizes[2];
    if (cap < sizes[1])
        cap = sizes[1];
    size_t nmax = (cap / sizeof(float) / g_size + 1) * g_size;
    float *a = calloc(nmax, sizeof(float)), *b = calloc(nmax, sizeof(float));
    int ok = a && b, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        free(a), free(b);
        return DEAR_ERR_NOMEM;
    }
    memset(model, 0, sizeof *model);
    model->comm_size = g_size;
    model->ranks_per_host = 1;
    snprintf(model->source, sizeof model->source, "bench-fit-mpi");
    int rc = DEAR_OK;
    for (int op = 0; op < DEAR_COST_NOPS && rc == DEAR_OK; op++) {
        double xs[3], ys[3];
        int n = 0;
        for (int si = 0; si < 3; si++) {
            size_t bytes = sizes[si] > cap ? cap : sizes[si];
            if (si > 0 && bytes == sizes[si - 1])
                break;
            int per = (int)(bytes / sizeof(float) / g_size);
            if (per < 1)
                per = 1;
            double best = INFINITY;
            for (int rep = 0; rep < 4; rep++) {
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = MPI_Wtime();
                if (op == DEAR_COST_RS)
                    MPI_Reduce_scatter_block(a, b, per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                else if (op == DEAR_COST_AG)
                    MPI_Allgather(a, per, MPI_FLOAT, b, per, MPI_FLOAT, MPI_COMM_WORLD);
                else
                    MPI_Allreduce(a, b, per * g_size, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                double dt = MPI_Wtime() - t0, dtmax;
                MPI_Allreduce(&dt, &dtmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (rep > 0) /* the first call sets up connections */
                    best = fmin(best, dtmax);
            }
            xs[n] = (double)per * g_size * sizeof(float);
            ys[n] = best;
            n++;
        }
        rc = dear_cost_fit(xs, ys, n, &model->line[op][DEAR_COST_RING]);
    }
    free(a), free(b);
    return rc;
}

/* A calibration cache's entry for this communicator, keyed by ranks per host as MPI sees
 * shared-memory nodes (the runtime's key, stored in *rph). Rank 0 reads path (the other ranks'
 * is not used), everyone receives: the runtime writes its cache on rank 0 only. *found: lines in
 * the entry. Collective. */
static int load_calibration(const char *path, dear_cost_model_t *model, int *found, int *rph_out)
{
    MPI_Comm node;
    int rph = 1, rc = DEAR_OK;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &rph);
    MPI_Comm_free(&node);
    MPI_Allreduce(MPI_IN_PLACE, &rph, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    *found = 0;
    if (g_rank == 0)
        rc = dear_cost_load(path, g_size, rph, model, found);
    int hdr[2] = { rc, *found };
    MPI_Bcast(hdr, 2, MPI_INT, 0, MPI_COMM_WORLD);
    rc = hdr[0], *found = hdr[1];
    if (rc == DEAR_OK && *found)
        MPI_Bcast(model, (int)sizeof *model, MPI_BYTE, 0, MPI_COMM_WORLD);
    *rph_out = rph;
    return rc;
}

/* The model the predictions use: the one asked for, else (use_runtime) the runtime's own
 * calibration from the runs just made, in rank 0's runtime_calib, else a fit of MPI's
 * collectives. Collective. */
static int load_model(const opts_t *o, int use_runtime, const char *runtime_calib, size_t total_bytes,
                      dear_cost_model_t *model)
{
    if (o->preset)
        return dear_cost_preset(o->preset, g_size, 1, model);
    if (o->have_ab)
        return dear_cost_from_alpha_beta(o->alpha, o->beta, g_size, model);
    int found = 0, rph = 1, rc;
    if (o->calibration) {
        if ((rc = load_calibration(o->calibration, model, &found, &rph)) != DEAR_OK)
            return rc;
        if (!found && g_rank == 0)
            fprintf(stderr, "dear-bench: %s has no entry for %d ranks, %d per host\n", o->calibration, g_size, rph);
        return found ? DEAR_OK : DEAR_ERR_ARG;
    }
    if (use_runtime) {
        if ((rc = load_calibration(runtime_calib, model, &found, &rph)) != DEAR_OK)
            return rc;
        if (found) {
            snprintf(model->source, sizeof model->source, "runtime-fit");
            return DEAR_OK;
        }
    }
    return calibrate_mpi(total_bytes, model);
}

/* Rank 0: unless the user chose a model or a cache, the runtime calibrates into a temporary
 * cache, which the later configurations reuse (one calibration per run, one model for all) and
 * the predictions read. NULL when not used. The other ranks never read the variable. */
static char *runtime_calibration_file(const opts_t *o, int *created)
{
    static char path[4096];
    *created = 0;
    if (o->preset || o->have_ab || o->calibration || g_rank != 0)
        return NULL;
    const char *set = getenv("DEAR_CALIBRATION_FILE");
    if (set && set[0]) {
        snprintf(path, sizeof path, "%s", set);
        return path;
    }
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/dear-bench-calib-XXXXXX", dir && dir[0] ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0 || setenv("DEAR_CALIBRATION_FILE", path, 1) != 0) {
        fprintf(stderr, "dear-bench: cannot create a calibration cache %s (%s): every configuration calibrates "
                        "anew and predictions use a fit of MPI's collectives\n",
                path, strerror(errno));
        if (fd >= 0)
            close(fd), unlink(path);
        return NULL;
    }
    close(fd);
    *created = 1;
    return path;
}

/* The simulator's iteration time for a configuration on the scaled profile: of the plan the
 * runtime ran when known (ran), else planned the way the runtime plans it (same planner, same
 * scaled threshold). Optionally its Gantt chart. */
static int predict(const model_t *m, const dear_cost_model_t *model, const config_t *c, const opts_t *o,
                   const dear_plan_t *ran, double *iter_s)
{
    dear_sim_sched_t s;
    if (dear_sim_sched_parse(c->sched, &s))
        return DEAR_ERR_ARG;
    dear_sim_model_arg_t marg;
    dear_plan_problem_t prob;
    dear_plan_t plan = { 0 };
    dear_sim_result_t res = { 0 };
    int rc = dear_plan_problem_init(&prob, &m->prof, s, model, 0, &marg);
    if (rc != DEAR_OK)
        return rc;
    prob.threshold = scaled_threshold(c, o);
    if (ran && ran->ntensors == m->prof.ntensors && s != DEAR_SIM_SCHED_SYNC)
        rc = dear_plan_copy(&plan, ran);
    else
        rc = dear_plan_by_name(&plan, &prob, c->fusion);
    if (rc != DEAR_OK)
        return rc;
    rc = dear_sim_run(&m->prof, &prob.cost, s, &plan, o->svg_dir != NULL, &res);
    if (rc == DEAR_OK)
        *iter_s = res.iter_s;
    if (rc == DEAR_OK && o->svg_dir) {
        char path[1024], name[64], title[256];
        snprintf(name, sizeof name, "%s", c->text);
        for (char *p = name; *p; p++)
            if (*p == ':' || *p == '/' || *p == ' ')
                *p = '-';
        snprintf(path, sizeof path, "%s/pred-%s-np%d-%s.svg", o->svg_dir, m->prof.model, g_size, name);
        snprintf(title, sizeof title, "%s, P=%d (%s), %s: predicted", m->prof.model, g_size, model->source, c->text);
        FILE *f = fopen(path, "w");
        if (!f || dear_sim_svg(&res, title, f) != DEAR_OK)
            fprintf(stderr, "dear-bench: cannot write %s\n", path);
        if (f)
            fclose(f);
    }
    dear_sim_result_free(&res);
    dear_plan_free(&plan);
    return rc;
}

/* Issue 6's lower bound: max(compute, reduce-scatter + all-gather of every gradient) plus the
 * unavoidable tail: the last reduce-scatter (first layer's gradients, ready only when backward
 * ends) and the first all-gather (needed before the first forward layer). */
static double lower_bound(const model_t *m, const dear_cost_model_t *model)
{
    double comp = dear_prof_fwd_total(&m->prof) + dear_prof_bwd_total(&m->prof);
    double all = (double)dear_prof_bytes_total(&m->prof);
    double comm = dear_cost_eval(model, DEAR_COST_RS, all, NULL) + dear_cost_eval(model, DEAR_COST_AG, all, NULL);
    size_t first = 0;
    int l0 = m->prof.tensors[0].lidx;
    for (int t = 0; t < m->prof.ntensors && m->prof.tensors[t].lidx == l0; t++)
        first += m->prof.tensors[t].bytes;
    double tail = dear_cost_eval(model, DEAR_COST_RS, (double)first, NULL) +
                  dear_cost_eval(model, DEAR_COST_AG, (double)first, NULL);
    return fmax(comp, comm) + tail;
}

/* ---- main ---- */

static double it_q(double q_s, const result_t *r)
{
    return r->ok_run ? q_s * 1e3 : NAN;
}

static const char *csv_header = "model,np,config,schedule,fusion,threshold_bytes,iters,warmup,time_scale,size_scale,"
                                "grad_bytes,compute_ms,compute_meas_ms,iter_ms,iter_min_ms,iter_max_ms,exposed_ms,"
                                "blocked_ms,speedup_sync,speedup_wfbp64,pred_ms,pred_err_pct,bound_ms,iter_over_bound,"
                                "cost_model,check,iter_q1_ms,iter_q3_ms,plan,rs_buckets,ag_groups,ag_early";

int main(int argc, char **argv)
{
    int provided;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    opts_t o;
    memset(&o, 0, sizeof o);
    /* A rank that dies mid-run would leave the others waiting for its data forever: unless the
     * user chose otherwise, the runtime aborts the job after two minutes without progress. */
    if (!getenv("DEAR_STALL_ABORT_S"))
        setenv("DEAR_STALL_ABORT_S", "120", 0);
    int status = parse_args(argc, argv, &o);
    if (status != 0) {
        MPI_Finalize();
        return status < 0 ? 0 : status;
    }
    dear_profile_t src = { 0 };
    if (dear_prof_load(o.profile, &src) != DEAR_OK) {
        if (g_rank == 0)
            fprintf(stderr, "dear-bench: cannot use profile %s (see the error above)\n", o.profile);
        MPI_Finalize();
        return 2;
    }
    model_t m;
    memset(&m, 0, sizeof m);
    int rc = model_build(&src, &o, &m), any, local;
    dear_prof_free(&src);
    local = rc != DEAR_OK;
    MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any) {
        model_free(&m);
        MPI_Finalize();
        return rc == DEAR_ERR_FORMAT ? 2 : 1;
    }
    double F = dear_prof_fwd_total(&m.prof), B = dear_prof_bwd_total(&m.prof);
    if (!o.quiet)
        say("dear-bench: %s, %d ranks; %d layers, %d tensors, %.2f MiB of float32 gradients (size x %g); "
            "forward %.3f ms + backward %.3f ms (time x %g); %d measured iterations per configuration in %d "
            "round(s), after %s warm-up iterations per run\n\n",
            m.prof.model, g_size, m.prof.nlayers, m.prof.ntensors, dear_prof_bytes_total(&m.prof) / 1048576.0,
            o.size_scale, F * 1e3, B * 1e3, o.time_scale, o.iters, o.rounds,
            o.warmup >= 0 ? "--warmup" : "its planner's");
    int calib_created = 0;
    char *calib = runtime_calibration_file(&o, &calib_created);
    int use_rt_calib = calib != NULL;
    MPI_Bcast(&use_rt_calib, 1, MPI_INT, 0, MPI_COMM_WORLD);

    result_t res[MAX_CONFIGS];
    memset(res, 0, sizeof res);
    int failed_check = 0, broken = 0, refused = 0;
    for (int round = 0; round < o.rounds && !broken; round++) {
        int iters = o.iters / o.rounds + (round < o.iters % o.rounds);
        for (int i = 0; i < o.nconfigs; i++) {
            if (round > 0 && !res[i].ok_run)
                continue; /* refused: the same again */
            if (!o.quiet)
                say("running %s (round %d of %d) ...\n", o.configs[i].text, round + 1, o.rounds);
            rc = run_config(&o.configs[i], &o, iters, &m, &res[i]);
            if (rc != DEAR_OK) {
                broken = 1;
                if (g_rank == 0)
                    fprintf(stderr, "dear-bench: configuration %s: %s\n", o.configs[i].text, res[i].status);
                o.nconfigs = i + 1;
                break; /* the runtime's state after a failed run is unknown: stop here */
            }
        }
    }
    for (int i = 0; i < o.nconfigs; i++) {
        result_finish(&res[i]);
        res[i].pred_s = NAN;
        if (broken && i == o.nconfigs - 1)
            continue;
        if (!res[i].ok_run) {
            refused = 1;
            if (g_rank == 0)
                fprintf(stderr, "dear-bench: configuration %s: %s\n", o.configs[i].text, res[i].status);
        } else if (!res[i].check_ok) {
            failed_check = 1;
            if (g_rank == 0)
                fprintf(stderr, "dear-bench: configuration %s: PARAMETER CHECK FAILED (%s)\n", o.configs[i].text,
                        res[i].status);
        }
    }

    /* Predictions, with the model the runtime planned with when it calibrated during the runs. */
    dear_cost_model_t model;
    rc = load_model(&o, use_rt_calib, calib, dear_prof_bytes_total(&m.prof), &model);
    if (calib_created)
        unlink(calib);
    if (rc != DEAR_OK) {
        if (g_rank == 0)
            fprintf(stderr, "dear-bench: no cost model for predictions: %s\n", dear_status_string(rc));
        model_free(&m);
        MPI_Finalize();
        return 2;
    }
    double bound = lower_bound(&m, &model);
    if (!o.quiet) {
        say("\n");
        if (g_rank == 0)
            dear_cost_print(stdout, &model);
        say("lower bound (issue 6): %.3f ms\n", bound * 1e3);
    }
    for (int i = 0; i < o.nconfigs; i++) {
        double p;
        if (predict(&m, &model, &o.configs[i], &o, &res[i].plan, &p) == DEAR_OK)
            res[i].pred_s = p;
    }

    /* References measured in this invocation: sync, and wfbp + threshold 64 MiB. */
    double t_sync = NAN, t_w64 = NAN;
    for (int i = 0; i < o.nconfigs; i++) {
        if (!res[i].ok_run)
            continue;
        if (!strcmp(o.configs[i].sched, "sync"))
            t_sync = res[i].iter_s;
        if (!strcmp(o.configs[i].sched, "wfbp") && !strcmp(o.configs[i].fusion, "threshold") &&
            o.configs[i].threshold == REF64M)
            t_w64 = res[i].iter_s;
    }
    say("\n%-24s %9s %9s %9s %9s %8s %8s %9s %7s %8s %-5s %s\n", "config", "iter_ms", "compute", "exposed",
        "blocked", "vs_sync", "vs_w64", "pred_ms", "err%", "/bound", "check", "plan run (buckets/groups/early)");
    FILE *csv = NULL;
    if (o.csv && g_rank == 0) {
        csv = fopen(o.csv, "w");
        if (!csv) {
            fprintf(stderr, "dear-bench: cannot write %s: %s\n", o.csv, strerror(errno));
            broken = 1;
        } else {
            fprintf(csv, "%s\n", csv_header);
        }
    }
    for (int i = 0; i < o.nconfigs; i++) {
        const result_t *r = &res[i];
        const config_t *c = &o.configs[i];
        double it = r->ok_run ? r->iter_s : NAN;
        double err = 100 * (r->pred_s - it) / it;
        char vs[2][16];
        for (int k = 0; k < 2; k++) {
            double ref = k ? t_w64 : t_sync;
            if (isfinite(ref) && r->ok_run)
                snprintf(vs[k], sizeof vs[k], "%.3fx", ref / it);
            else
                snprintf(vs[k], sizeof vs[k], "-");
        }
        const dear_plan_t *pl = &r->plan;
        char ran[96] = "-";
        if (pl->ntensors > 0)
            snprintf(ran, sizeof ran, "%s %d/%d/%d", pl->planner, pl->rs.ngroups, pl->ag.ngroups, pl->ag_early);
        if (r->ok_run)
            say("%-24s %9.3f %9.3f %9.3f %9.3f %8s %8s %9.3f %+6.1f%% %8.3f %-5s %s\n", c->text, it * 1e3,
                r->compute_s * 1e3, (it - r->compute_s) * 1e3, r->blocked_s * 1e3, vs[0], vs[1], r->pred_s * 1e3,
                err, it / bound, r->status, ran);
        else
            say("%-24s %9s %9s %9s %9s %8s %8s %9.3f %7s %8s %s\n", c->text, "-", "-", "-", "-", "-", "-",
                r->pred_s * 1e3, "-", "-", r->status);
        if (csv)
            fprintf(csv, "%s,%d,%s,%s,%s,%zu,%d,%d,%g,%g,%zu,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f,"
                         "%.4f,%.4f,%s,%s,%.4f,%.4f,%s,%d,%d,%d\n",
                    m.prof.model, g_size, c->text, c->sched, c->fusion, scaled_threshold(c, &o), o.iters, c->warmup,
                    o.time_scale, o.size_scale, dear_prof_bytes_total(&m.prof), (F + B) * 1e3, r->compute_s * 1e3,
                    it * 1e3, r->iter_min_s * 1e3, r->iter_max_s * 1e3, (it - r->compute_s) * 1e3,
                    r->blocked_s * 1e3, t_sync / it, t_w64 / it, r->pred_s * 1e3, err, bound * 1e3, it / bound,
                    model.source, r->ok_run ? r->status : "refused", it_q(r->iter_q1_s, r), it_q(r->iter_q3_s, r),
                    pl->ntensors > 0 ? pl->planner : "-", pl->rs.ngroups, pl->ag.ngroups, pl->ag_early);
    }
    for (int i = 0; i < o.nconfigs; i++) {
        dear_plan_free(&res[i].plan);
        free(res[i].samples);
        free(res[i].comp);
    }
    if (csv && fclose(csv) != 0) {
        fprintf(stderr, "dear-bench: error writing %s\n", o.csv);
        broken = 1;
    }
    say("compute: measured emulated compute (sleep + gradient writes), nominal %.3f ms; exposed = iter - compute; "
        "blocked: application time blocked in libdear per iteration (dear_get_stats, slowest rank); pred: "
        "simulator with cost model %s\n",
        (F + B) * 1e3, model.source);
    model_free(&m);
    MPI_Bcast(&broken, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    if (failed_check || broken)
        return 1;
    return refused ? 3 : 0;
}

/*
 * args.c: dear-bench's command line. Options come from getopt_long, a single configuration from
 * --schedule/--fusion/--threshold or the DEAR_* variables the runtime itself reads, several from
 * --configs "SCHEDULE[:PLANNER[:THRESHOLD]][+sparse][+shard][+part=SIZE][+first=MODE][+hold][+nohints]
 * [+bf16|+fp16|+int8|+compress=RS/AG][+ef|+noef];...". Every rank parses the same argv and checks it
 * completely before any collective call, so a bad argument ends all ranks with status 2 and one
 * message (rank 0's) instead of leaving some of them waiting. Each configuration also gets its
 * warm-up: the iterations its planner needs before its plan is in place.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/cost.h"
#include "base/params.h"
#include "base/planner_table.h"
#include "base/sched_table.h"
#include "base/textio.h"
#include "base/util.h"
#include "include/dear.h"
#include "apps/bench/args.h"
#include "apps/bench/bench.h"

#define DEFAULT_CONFIGS \
    "sync;wfbp:threshold:64m;wfbp:threshold:25m;wfbp:mgwfbp;dear:threshold:25m;dear:gradssa;dear:auto"

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    if (bench_rank == 0) {
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
    bench_say("usage: mpirun -np P dear-bench --profile FILE [options]\n"
        "Emulate a model's compute from its profile (sleeping), synchronise real float32 gradients\n"
        "through libdear, check the parameters, and compare measured iteration times with the\n"
        "simulator's prediction for each configuration.\n"
        "\n"
        "  --profile FILE       model profile (docs/FORMATS.md; fusion/profiles/ ships seven)\n"
        "  --configs LIST       configurations run one after another, ';' or ',' separated, each\n"
        "                       SCHEDULE[:PLANNER[:THRESHOLD]][+sparse][+shard][+part=SIZE]\n"
        "                       [+first=MODE][+hold][+nohints][+bf16|+fp16|+int8|+compress=RS/AG]\n"
        "                       [+ef|+noef], e.g.\n"
        "                       \"%s\"\n"
        "                       (SCHEDULE dear|wfbp|sync; PLANNER none|threshold|mgwfbp|dp|gradssa|auto;\n"
        "                       THRESHOLD bytes with k/m/g = KiB/MiB/GiB, default 25m; +sparse: the\n"
        "                       profile's sparse tensors travel sparse, DEAR_SPARSE=auto, else off;\n"
        "                       +shard: sharded updates (DEAR_SHARD=1), each rank steps its slices;\n"
        "                       +part=SIZE: tensors above SIZE bytes are cut into chunks the planner\n"
        "                       places like tensors, DEAR_PARTITION, 0 never. Without it wfbp and sync\n"
        "                       keep every tensor whole, as Horovod and PyTorch DDP do, and dear\n"
        "                       runs DEAR_PARTITION (default %s). SIZE scales with --size-scale;\n"
        "                       +first=first|range|threshold: DEAR_FIRST_PLAN, the plan before\n"
        "                       the measured profile; +hold: that plan all run long; +nohints:\n"
        "                       without the --hints)\n"
        "                       +bf16, +fp16, +int8: float32 gradients travel in that format in both\n"
        "                       phases (DEAR_COMPRESS), +compress=RS/AG each phase's\n"
        "                       (none|bf16|fp16|int8), +ef, +noef: with or without error feedback\n"
        "                       (DEAR_COMPRESS_EF; default: with int8, without otherwise); the\n"
        "                       prediction and the lower bound price the bytes that travel)\n"
        "  --schedule S, --fusion X, --threshold BYTES\n"
        "                       one configuration (default: DEAR_SCHEDULE, DEAR_FUSION,\n"
        "                       DEAR_FUSION_THRESHOLD, else dear, threshold, 25m); not with --configs\n"
        "  --iters N            measured iterations per configuration (default 20)\n"
        "  --rounds R           run the configuration list R times, N/R measured iterations each,\n"
        "                       and pool them (default 1): a stall of the machine then hits a part\n"
        "                       of several configurations rather than one whole\n"
        "  --warmup N           iterations before measuring, in every run (default per planner:\n"
        "                       none/threshold/sync 3; mgwfbp/dp/gradssa DEAR_WARMUP_ITERS + 2;\n"
        "                       auto also waits for its checks, three blocks of DEAR_VERIFY_ITERS\n"
        "                       iterations per plan each after one settling iteration, for up\n"
        "                       to DEAR_VERIFY_TRIES plans: DEAR_WARMUP_ITERS + 3 x (2 x\n"
        "                       DEAR_VERIFY_ITERS + 3) + 2 = 40)\n"
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
        "  --jitter-ms X        injected noise: every rank sleeps an extra time drawn uniformly\n"
        "                       from [0, X] ms in each iteration (before its first layer's forward,\n"
        "                       counted as compute), so decisions taken on timings (auto's check)\n"
        "                       can be tried under noise of a known size (default 0: none)\n"
        "  --jitter-seed S      seed of the jitter (default 1); each rank draws its own sequence,\n"
        "                       a function of seed, rank and iteration, so every configuration of\n"
        "                       a run sees the same jitter\n"
        "  --tokens N           sparse tensors (profile 'sparse' records): rows touched per rank and\n"
        "                       iteration are N draws from a Zipf distribution over the rows, a new\n"
        "                       set each iteration, different on each rank (default: N such that\n"
        "                       the expected share of rows touched is the profile's RS_DENSITY)\n"
        "  --zipf S             exponent of that distribution: row k drawn with weight 1/k^S\n"
        "                       (default 1.0, as word frequencies)\n"
        "  --hints FILE         a model description of the profile's model (fusion/profiles/*.model):\n"
        "                       its layers' compute hints go to dear_set_layer_cost, those of layers\n"
        "                       without tensors to the layer before them (where the runtime sees\n"
        "                       their time)\n"
        "  --first-n N          report the time to train the first N iterations of a run, from\n"
        "                       dear_init, and of the whole run (default 30)\n"
        "  --link-rate MBPS     the lower bound's link rate in MB/s (one way, per host; default:\n"
        "                       measured here, the fastest of three streams of 16 MiB from rank 0\n"
        "                       to the first rank on another host, or on its own with one host)\n"
        "  --calib-load         while dear_commit runs (and calibrates), a thread on every rank\n"
        "                       replays the model's compute as training runs it, sleeping each\n"
        "                       layer's time and writing its gradients' bytes, so the collectives\n"
        "                       calibrated share the cores as in training (an experiment: the\n"
        "                       cache it writes holds that loaded calibration)\n"
        "  --csv FILE           also write the results as CSV (rank 0)\n"
        "  --svg-dir DIR        write the predicted Gantt chart of each configuration there\n"
        "  --quiet              only the result table\n"
        "DEAR_STALL_ABORT_S defaults to 120 here, so a broken run ends instead of hanging.\n"
        "  --help               this text\n"
        "Exit status: 0 all configurations ran and passed the parameter check; 1 a check failed or\n"
        "the run broke; 2 bad arguments or profile; 3 the runtime refused a configuration.\n",
        DEFAULT_CONFIGS, dear_param_table[DEAR_P_PARTITION].defval, dear_cost_preset_names());
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
    dear_sched_t sc;
    return dear_sched_parse(s, &sc) == 0;
}

static int valid_planner(const char *s)
{
    dear_planner_t p;
    return dear_planner_parse(s, &p) == 0;
}

/* A partition size as DEAR_PARTITION takes it; "what" names it in the message. */
static int parse_partition(const char *text, const char *what, long long *v)
{
    char msg[256];
    if (dear_param_parse_int(DEAR_P_PARTITION, text, v, msg, sizeof msg) != DEAR_OK)
        return usage_error("%s: %s", what, msg);
    return 0;
}

/* partition < 0: the schedule's default. wfbp and sync stand for Horovod and PyTorch DDP, which
 * send every tensor whole; dear runs what the runtime would, DEAR_PARTITION or its default. */
static int make_config(bench_config_t *c, const char *text, const char *sched, const char *fusion, size_t threshold,
                       long long partition)
{
    if (!valid_sched(sched))
        return usage_error("configuration '%s': schedule '%s' is not one of %s", text, sched, DEAR_SCHED_CHOICES);
    if (strcmp(sched, "sync") != 0 && !valid_planner(fusion))
        return usage_error("configuration '%s': planner '%s' is not one of %s", text, fusion, DEAR_PLANNER_CHOICES);
    if (partition < 0 && strcmp(sched, "dear") != 0)
        partition = 0;
    if (partition < 0) {
        const char *env = getenv("DEAR_PARTITION");
        if (parse_partition(env && env[0] ? env : dear_param_table[DEAR_P_PARTITION].defval, "DEAR_PARTITION",
                            &partition))
            return 2;
    }
    snprintf(c->text, sizeof c->text, "%s", text);
    snprintf(c->sched, sizeof c->sched, "%s", sched);
    snprintf(c->fusion, sizeof c->fusion, "%s", strcmp(sched, "sync") ? fusion : "one");
    c->threshold = threshold;
    c->partition = partition;
    return 0;
}

/* What the '+' suffixes of a configuration set. */
typedef struct {
    int sparse, shard, hold, nohints;
    long long partition;        /* -1: none given */
    char first[12];
    bench_config_t comp;        /* comp_rs, comp_ag and ef */
} suffixes_t;

/* "+compress=RS/AG" (or one format for both) into c's formats; 0, or -1 when it is not that. */
static int parse_compress(const char *spec, bench_config_t *c)
{
    char rs[16], ag[16];
    const char *slash = strchr(spec, '/');
    snprintf(rs, sizeof rs, "%.*s", slash ? (int)(slash - spec) : (int)strlen(spec), spec);
    snprintf(ag, sizeof ag, "%s", slash ? slash + 1 : rs);
    dear_compress_t a, b;
    if (dear_compress_parse(rs, &a) || dear_compress_parse(ag, &b))
        return -1;
    c->comp_rs = (int)a, c->comp_ag = (int)b;
    return 0;
}

/* The '+' suffixes of a configuration (cut off buf): +sparse, +shard, +part=SIZE, +first=MODE,
 * +hold, +nohints, a compression (+bf16, +fp16, +int8, +compress=RS/AG) and +ef or +noef, each
 * at most once. comp.ef: 1 +ef, -1 +noef, 0 neither. */
static int parse_suffixes(char *buf, const char *tok, suffixes_t *x)
{
    char *plus = strchr(buf, '+');
    int have_comp = 0;
    bench_config_t *comp = &x->comp;
    *x = (suffixes_t){ .partition = -1 };
    if (!plus)
        return 0;
    *plus++ = 0;
    for (char *sfx = plus, *next; sfx; sfx = next) {
        next = strchr(sfx, '+');
        if (next)
            *next++ = 0;
        if (strcmp(sfx, "sparse") == 0 && !x->sparse) {
            x->sparse = 1;
        } else if (strcmp(sfx, "shard") == 0 && !x->shard) {
            x->shard = 1;
        } else if (strcmp(sfx, "hold") == 0 && !x->hold) {
            x->hold = 1;
        } else if (strcmp(sfx, "nohints") == 0 && !x->nohints) {
            x->nohints = 1;
        } else if (strncmp(sfx, "first=", 6) == 0 && !x->first[0]) {
            if (strcmp(sfx + 6, "first") && strcmp(sfx + 6, "range") && strcmp(sfx + 6, "threshold"))
                return usage_error("--configs: '%s': +first=%s is not one of first|range|threshold", tok, sfx + 6);
            snprintf(x->first, sizeof x->first, "%s", sfx + 6);
        } else if (strncmp(sfx, "part=", 5) == 0 && x->partition < 0) {
            char what[96];
            snprintf(what, sizeof what, "--configs '%s': +part", tok);
            if (parse_partition(sfx + 5, what, &x->partition))
                return 2;
        } else if (!have_comp && (!strcmp(sfx, "bf16") || !strcmp(sfx, "fp16") || !strcmp(sfx, "int8") ||
                                  !strncmp(sfx, "compress=", 9))) {
            have_comp = 1;
            if (parse_compress(strncmp(sfx, "compress=", 9) ? sfx : sfx + 9, comp))
                return usage_error("--configs: '%s': '+%s': a format is one of %s (+compress=RS/AG for each "
                                   "phase's)", tok, sfx, DEAR_COMPRESS_CHOICES);
        } else if ((!strcmp(sfx, "ef") || !strcmp(sfx, "noef")) && !comp->ef) {
            comp->ef = strcmp(sfx, "ef") ? -1 : 1;
        } else {
            return usage_error("--configs: '%s': suffix '+%s' is not +sparse, +shard, +part=SIZE, +first=MODE, "
                               "+hold, +nohints, +bf16, +fp16, +int8, +compress=RS/AG, +ef or +noef (each at most "
                               "once, +ef or +noef)",
                               tok, sfx);
        }
    }
    return 0;
}

static int parse_configs(const char *list, bench_opts_t *o)
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
        suffixes_t x;
        snprintf(buf, sizeof buf, "%s", tok);
        if ((rc = parse_suffixes(buf, tok, &x)) != 0)
            break;
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
        rc = make_config(&o->configs[o->nconfigs], tok, f[0], f[1] ? f[1] : "threshold", thr, x.partition);
        if (!rc) {
            bench_config_t *c = &o->configs[o->nconfigs++];
            c->sparse = x.sparse;
            c->shard = x.shard;
            c->hold = x.hold;
            c->nohints = x.nohints;
            snprintf(c->first, sizeof c->first, "%s", x.first);
            c->comp_rs = x.comp.comp_rs, c->comp_ag = x.comp.comp_ag;
            /* the library's default: int8 keeps its residuals, 16 bits do not */
            int int8 = c->comp_rs == DEAR_COMPRESS_INT8 || c->comp_ag == DEAR_COMPRESS_INT8;
            c->ef = x.comp.ef ? x.comp.ef > 0 : int8;
        }
    }
    free(dup);
    if (!rc && o->nconfigs == 0)
        rc = usage_error("--configs '%s' names no configuration", list);
    return rc;
}

/* The configuration of --schedule/--fusion/--threshold (or the DEAR_* environment). */
static int parse_single(bench_opts_t *o, const char *sched, const char *fusion, const char *thr_text)
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
    /* Here the environment speaks for the one configuration, whatever its schedule. */
    const char *penv = getenv("DEAR_PARTITION");
    long long partition = -1;
    if (penv && penv[0] && parse_partition(penv, "DEAR_PARTITION", &partition))
        return 2;
    o->nconfigs = 1;
    return make_config(&o->configs[0], text, sched, fusion, thr, partition);
}

/* What the command line says about the configurations and the cost model, checked later. */
typedef struct {
    const char *configs, *sched, *fusion, *thr_text;
    int have_a, have_b;
} raw_args_t;

/* The options one by one, with their defaults: 0, -1 after --help, 2 on a bad one. */
static int read_options(int argc, char **argv, bench_opts_t *o, raw_args_t *r)
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
        { "rounds", required_argument, 0, 'R' },      { "jitter-ms", required_argument, 0, 'J' },
        { "jitter-seed", required_argument, 0, 'j' }, { "tokens", required_argument, 0, 'k' },
        { "zipf", required_argument, 0, 'z' },        { "hints", required_argument, 0, 'H' },
        { "first-n", required_argument, 0, 'N' },     { "link-rate", required_argument, 0, 'L' },
        { "calib-load", no_argument, 0, 'l' },
        { 0, 0, 0, 0 }
    };
    int c;
    o->iters = 20;
    o->warmup = -1;
    o->rounds = 1;
    o->jitter_seed = 1;
    o->zipf = 1.0;
    o->first_n = 30;
    o->time_scale = o->size_scale = 1.0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
        switch (c) {
        case 'f': o->profile = optarg; break;
        case 'C': r->configs = optarg; break;
        case 's': r->sched = optarg; break;
        case 'x': r->fusion = optarg; break;
        case 't': r->thr_text = optarg; break;
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
        case 'J':
            if (dear_text_double(optarg, 0, 1e5, &o->jitter_ms))
                return usage_error("--jitter-ms '%s' is not a number of milliseconds in [0, 100000]", optarg);
            break;
        case 'j':
            if (parse_int(optarg, 0, 2147483647, &o->jitter_seed))
                return usage_error("--jitter-seed '%s' is not an integer in [0, 2147483647]", optarg);
            break;
        case 'k': {
            int n;
            if (parse_int(optarg, 1, 1000000000, &n))
                return usage_error("--tokens '%s' is not an integer in [1, 1000000000]", optarg);
            o->tokens = n;
            break;
        }
        case 'H': o->hints = optarg; break;
        case 'N':
            if (parse_int(optarg, 1, 1000000, &o->first_n))
                return usage_error("--first-n '%s' is not an integer in [1, 1000000]", optarg);
            break;
        case 'L':
            if (dear_text_double(optarg, 1e-3, 1e9, &o->link_mbps))
                return usage_error("--link-rate '%s' is not a rate in MB/s in [0.001, 1e9]", optarg);
            break;
        case 'z':
            if (dear_text_double(optarg, 0, 10, &o->zipf))
                return usage_error("--zipf '%s' is not an exponent in [0, 10]", optarg);
            break;
        case 'p': o->preset = optarg; break;
        case 'a':
            if (dear_text_double(optarg, 0, HUGE_VAL, &o->alpha))
                return usage_error("--alpha '%s' is not a time in seconds >= 0", optarg);
            r->have_a = 1;
            break;
        case 'b':
            if (dear_text_double(optarg, 0, HUGE_VAL, &o->beta))
                return usage_error("--beta '%s' is not a time per byte in seconds >= 0", optarg);
            r->have_b = 1;
            break;
        case 'c': o->calibration = optarg; break;
        case 'o': o->csv = optarg; break;
        case 'g': o->svg_dir = optarg; break;
        case 'q': o->quiet = 1; break;
        case 'l': o->calib_load = 1; break;
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
    return 0;
}

/* At most one of --preset, --alpha with --beta, --calibration; a preset must exist. */
static int check_cost_model(bench_opts_t *o, const raw_args_t *r)
{
    o->have_ab = r->have_a || r->have_b;
    if (o->have_ab && !(r->have_a && r->have_b))
        return usage_error("--alpha and --beta go together");
    if ((o->preset != NULL) + o->have_ab + (o->calibration != NULL) > 1)
        return usage_error("give at most one cost model: --preset, --alpha/--beta or --calibration");
    if (o->preset) {
        dear_cost_model_t m;
        if (dear_cost_preset(o->preset, 2, 1, &m) != DEAR_OK)
            return usage_error("--preset '%s' is not one of %s", o->preset, dear_cost_preset_names());
    }
    return 0;
}

/* The runtime's value of an integer parameter as dear_init will read it: the environment's when
 * valid (the runtime reports a bad value itself at dear_init), else the table's default. */
static int runtime_param(dear_param_id_t id)
{
    char name[64], msg[256];
    long long v = 0;
    snprintf(name, sizeof name, "DEAR_%s", dear_param_table[id].name);
    const char *env = getenv(name);
    if (!env || dear_param_parse_int(id, env, &v, msg, sizeof msg) != DEAR_OK)
        dear_param_parse_int(id, dear_param_table[id].defval, &v, msg, sizeof msg);
    return (int)v;
}

int bench_shard_early(void) { return runtime_param(DEAR_P_SHARD_EARLY); }

/* The runtime plans after DEAR_WARMUP_ITERS and (auto) checks the plan in three blocks (new,
 * old, new; runtime/planning.c), each one settling iteration and then its share of
 * DEAR_VERIFY_ITERS per plan, and where the plan loses, each runner-up likewise, up to
 * DEAR_VERIFY_TRIES plans; the measured iterations start after all of them. */
static void runtime_warmup(int *rt_warm, int *rt_verify, int *rt_tries)
{
    *rt_warm = runtime_param(DEAR_P_WARMUP_ITERS);
    *rt_verify = runtime_param(DEAR_P_VERIFY_ITERS);
    *rt_tries = runtime_param(DEAR_P_VERIFY_TRIES);
}

/* Warm-up per configuration: what its plan needs before it is in place, unless --warmup. */
static void set_warmups(bench_opts_t *o, int rt_warm, int settled)
{
    for (int i = 0; i < o->nconfigs; i++) {
        bench_config_t *cf = &o->configs[i];
        int fixed = !strcmp(cf->fusion, "none") || !strcmp(cf->fusion, "threshold") || !strcmp(cf->fusion, "one");
        cf->warmup = o->warmup >= 0 ? o->warmup
                     : fixed || cf->hold ? 3
                     : !strcmp(cf->fusion, "auto") ? settled + 2
                                                   : rt_warm + 2;
    }
}

int bench_parse_args(int argc, char **argv, bench_opts_t *o)
{
    raw_args_t r = { 0 };
    int rc = read_options(argc, argv, o, &r);
    if (rc != 0)
        return rc;
    if (!o->profile)
        return usage_error("--profile FILE is required");
    if ((rc = check_cost_model(o, &r)) != 0)
        return rc;
    int rt_warm, rt_verify, rt_tries;
    runtime_warmup(&rt_warm, &rt_verify, &rt_tries);
    int settled = rt_warm + (rt_verify > 0 ? rt_tries * (2 * rt_verify + 2 + (rt_verify / 2 > 0)) : 0);
    if (o->warmup >= 0 && o->warmup <= settled && !o->quiet)
        bench_say("dear-bench: note: --warmup %d <= %d (DEAR_WARMUP_ITERS %d, then auto's check of DEAR_VERIFY_ITERS %d, "
            "up to DEAR_VERIFY_TRIES %d plans): measured iterations of auto may include the runtime's own warm-up, "
            "planning and check\n",
            o->warmup, settled, rt_warm, rt_verify, rt_tries);
    if (o->rounds > o->iters)
        return usage_error("--rounds %d exceeds --iters %d: every round measures at least one iteration", o->rounds,
                           o->iters);
    if (r.configs) {
        if (r.sched || r.fusion || r.thr_text)
            return usage_error("--configs cannot be combined with --schedule, --fusion or --threshold");
        rc = parse_configs(r.configs, o);
    } else {
        rc = parse_single(o, r.sched, r.fusion, r.thr_text);
    }
    if (rc == 0)
        set_warmups(o, rt_warm, settled);
    return rc;
}
size_t bench_scaled_threshold(const bench_config_t *c, const bench_opts_t *o)
{
    double t = floor((double)c->threshold * o->size_scale + 0.5);
    return t < 1 ? 1 : (size_t)t;
}

size_t bench_scaled_partition(const bench_config_t *c, const bench_opts_t *o)
{
    double p = floor((double)c->partition * o->size_scale + 0.5);
    return c->partition == 0 ? 0 : p < 1 ? 1 : (size_t)p;
}

/*
 * args.h: dear-bench's command line: the options (bench_opts_t) and the configurations to run
 * (bench_config_t), parsed and checked on every rank alike, so that all ranks reach the same verdict
 * without talking.
 */
#ifndef DEAR_APPS_BENCH_ARGS_H
#define DEAR_APPS_BENCH_ARGS_H

#include <stddef.h>

#define MAX_CONFIGS 32

typedef struct {
    char text[64];              /* as given, e.g. "wfbp:threshold:64m", "dear:auto+part=0" */
    char sched[8];              /* dear|wfbp|sync */
    char fusion[16];            /* planner; "one" for sync */
    size_t threshold;           /* bytes, before --size-scale */
    int warmup;                 /* iterations before measuring (per round) */
    int sparse;                 /* "+sparse": the profile's sparse tensors travel sparse (DEAR_SPARSE=auto) */
    int shard;                  /* "+shard": sharded updates (DEAR_SHARD=1) */
    long long partition;        /* DEAR_PARTITION in bytes, before --size-scale ("+part=SIZE"); 0: whole */
    char first[12];             /* "+first=MODE": DEAR_FIRST_PLAN for this configuration; "": the environment's */
    int hold;                   /* "+hold": the first plan all run long (DEAR_WARMUP_ITERS beyond the run) */
    int nohints;                /* "+nohints": --hints not given to the runtime (parameter bytes only) */
    int comp_rs, comp_ag;       /* "+bf16", "+fp16", "+compress=RS[/AG]": DEAR_COMPRESS, DEAR_COMPRESS_AG
                                 * (dear_compress_t values); 0, 0: uncompressed */
    int ef;                     /* "+ef": DEAR_COMPRESS_EF */
} bench_config_t;

typedef struct {
    const char *profile, *csv, *preset, *calibration, *svg_dir;
    double time_scale, size_scale, alpha, beta;
    int have_ab, iters, warmup, quiet;
    int rounds;                 /* the configuration list runs this many times, iters split over them */
    int fault;                  /* hidden: 1 perturbs one rank's gradient, 2 one rank's parameters */
    double jitter_ms;           /* --jitter-ms: injected noise per iteration and rank, uniform in [0, this] */
    int jitter_seed;            /* --jitter-seed */
    long tokens;                /* --tokens: rows drawn per rank and iteration of a sparse tensor; 0: from
                                 * the profile's density */
    double zipf;                /* --zipf: exponent of the token distribution */
    const char *hints;          /* --hints: a model description whose layer hints go to dear_set_layer_cost */
    int first_n;                /* --first-n: time to train this many iterations (from dear_init) */
    double link_mbps;           /* --link-rate: the lower bound's link rate (MB/s); 0: measured */
    int calib_load;             /* --calib-load: the model's compute replayed beside dear_commit */
    int nconfigs;
    bench_config_t configs[MAX_CONFIGS];
} bench_opts_t;

/* Fills o (zeroed by the caller) from argv and the DEAR_* environment. Returns 0 to run, -1
 * after --help (printed), 2 on a bad argument (rank 0 says why). */
int bench_parse_args(int argc, char **argv, bench_opts_t *o);

/* DEAR_SHARD_EARLY as the runtime will read it: sharded slices stepped during backward under dear. */
int bench_shard_early(void);

/* The configuration's fusion threshold in bytes after --size-scale, at least 1. */
size_t bench_scaled_threshold(const bench_config_t *c, const bench_opts_t *o);
/* The configuration's partition size in bytes after --size-scale: 0 stays 0, else at least 1. */
size_t bench_scaled_partition(const bench_config_t *c, const bench_opts_t *o);

#endif /* DEAR_APPS_BENCH_ARGS_H */

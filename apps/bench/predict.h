/*
 * predict.h: what dear-bench sets beside its measurements: the cost model, the simulator's
 * iteration time for each configuration under it, and the lower bound no schedule can beat.
 */
#ifndef DEAR_APPS_BENCH_PREDICT_H
#define DEAR_APPS_BENCH_PREDICT_H

#include <stddef.h>

#include "fusion/cost.h"
#include "fusion/plan.h"
#include "apps/bench/args.h"
#include "apps/bench/model.h"

/* Rank 0: the calibration cache the runtime writes during the runs and the predictions read;
 * *created when it is a temporary file to remove. NULL when not used, and on the other ranks. */
char *bench_runtime_calibration_file(const bench_opts_t *o, int *created);

/* The cost model of the predictions (see predict.c for the order of choice). Collective. */
int bench_load_model(const bench_opts_t *o, int use_runtime, const char *runtime_calib, size_t total_bytes,
               dear_cost_model_t *model);

/* The simulator's iteration time of configuration c, of the plan ran when known, each layer's
 * update time (upd_s, per layer index) added to its forward compute: the runtime runs a layer's
 * updates before its forward pass (dear) or ahead of the first one (sync, wfbp), on the
 * application's thread. late_s, how much after the median rank the last one ends its backward
 * pass, is added to the last backward (the first layer's): the profile is one rank's, and the
 * collectives of the pass's end wait for the last. With --svg-dir, its Gantt chart too. */
int bench_predict(const bench_model_t *m, const dear_cost_model_t *model, const bench_config_t *c, const bench_opts_t *o,
            const dear_plan_t *ran, const double *upd_s, double late_s, double *iter_s);

/* The links the lower bound counts: the one-way rate of the bottleneck link (bytes/s: between
 * hosts where there are several, else between two ranks of the one host), the hosts, and where
 * the rate comes from (for the report). */
typedef struct {
    double rate;
    int hosts;
    char source[96];
} bench_links_t;

/* The links of MPI_COMM_WORLD: hosts by shared memory; the rate given (mbps > 0, MB/s) or
 * measured: the fastest of three streams of 16 MiB from rank 0 to the first rank on another host
 * (on its own host when there is one). Collective. */
int bench_measure_links(double mbps, bench_links_t *links);

/* The iteration time no schedule can beat over these links, with compute running on one thread
 * (updates too, upd_s of them per iteration) and a layer's gradients ready when its backward ends,
 * needed all-gathered when its forward begins. Every phase must move, through the bottleneck link,
 * at least (H-1)/H of the bytes its gradient puts on the wire (H hosts; with one host, (P-1)/P
 * through each rank's). For each layer k, the bytes of layers 0..k travel between the end of k's
 * backward and the start of k's next forward, while the forward and backward of layers k..L-1 take
 * the rest of the iteration: max(compute + upd_s, max over k of compute(k..L-1) + link(0..k)). */
double bench_lower_bound(const bench_model_t *m, const bench_links_t *links, double upd_s);

#endif /* DEAR_APPS_BENCH_PREDICT_H */

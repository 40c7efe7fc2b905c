/*
 * Cost model of the collectives: time = alpha + (beta + gamma) * bytes for each collective
 * (reduce-scatter, all-gather, all-reduce) and algorithm (ring, rhd, mpi, auto). bytes is always
 * the full buffer size, as in nccl-tests. Lines come from a least-squares fit of measured
 * (bytes, seconds) samples, from a cache file keyed by communicator size, ranks per host,
 * collective and algorithm (docs/FORMATS.md), or from presets.
 *
 * A line may also carry the measured points themselves (a curve): it is then evaluated by
 * linear interpolation between them, and beyond the largest at the largest's time per byte.
 * The runtime calibrates the "auto" algorithm this way: what the collectives layer's selection
 * table actually runs at each size (direct up to a threshold, the ring above it), whose cost is
 * not one straight line. When a collective has an auto line, that is its cost; otherwise the
 * cost is the cheapest valid algorithm at that size. Pure C: no MPI or CUDA calls.
 */
#ifndef DEAR_FUSION_COST_H
#define DEAR_FUSION_COST_H

#include <stddef.h>
#include <stdio.h>

#include "base/algo_table.h"
#include "include/dear_types.h"

#define DEAR_COST_MAXPTS 12

typedef struct {
    int valid;          /* 0: no data for this collective and algorithm */
    double alpha;       /* start-up, seconds */
    double beta;        /* seconds per byte of the full buffer (transfer) */
    double gamma;       /* seconds per byte for the reduction; 0 when folded into beta (fits) */
    double fit_err;     /* max relative residual of the fit over its samples; 0 for presets */
    int nsamples;       /* samples behind the fit; 0 for presets */
    int npts;           /* 0: the line; 2..DEAR_COST_MAXPTS: the curve through these points */
    double pt_bytes[DEAR_COST_MAXPTS];  /* strictly increasing */
    double pt_sec[DEAR_COST_MAXPTS];    /* non-decreasing */
} dear_cost_line_t;

typedef struct {
    int comm_size;      /* P */
    int ranks_per_host;
    char source[32];    /* "fit", "file", "preset:10gbe", "alpha-beta", ... */
    dear_cost_line_t line[DEAR_COLL_OP_COUNT][DEAR_ALGO_COUNT];
    /* The auto curve of a float32 vector travelling in a compressed format, [format][op], by the
     * bytes it puts on the wire (the float32 bytes times dear_compress_ratio). Measured as the
     * collectives run it, it prices what the wire bytes alone miss: the conversions on the
     * progress thread, and int8's float32 stages inside a host under hier. [0] (none) unused. */
    dear_cost_line_t fmt[DEAR_COMPRESS_COUNT][DEAR_COLL_OP_COUNT];
    /* The auto curve of float32 collectives run burst_k at a time (0: none measured), as the
     * progress thread keeps up to DEAR_MAX_INFLIGHT in flight: seconds per collective in such a
     * stream, at the sizes where that many fit in DEAR_INFLIGHT_BYTES. A collective queued behind
     * another is priced by the ratio of this curve to the auto line (dear_cost_queued_factor). */
    int burst_k;
    dear_cost_line_t burst[DEAR_COLL_OP_COUNT];
    /* The auto curve of float32 collectives each timed alone after the link was idle for
     * DEAR_COST_IDLE_GAP_S, at the sizes from DEAR_COST_IDLE_MIN_BYTES: its slope prices the
     * bytes of a large collective that starts on an idle link (dear_cost_idle_factor), since the
     * line's back-to-back stream of large collectives can build a queue on a slow link that a lone
     * one never meets. */
    dear_cost_line_t idle[DEAR_COLL_OP_COUNT];
} dear_cost_model_t;

/* What "idle" means for the idle curve: nothing of the channel in flight for this long before a
 * collective starts (longer than the ranks' skew and a token bucket's refill), and the smallest
 * size it is measured at: below it a lone collective's time is mostly the network's burst
 * allowance. DEAR_COST_IDLE_TOL: a lone collective's price departs from the stream's only beyond
 * this share, since a slope taken from a few noisy points carries more noise than the points. */
#define DEAR_COST_IDLE_GAP_S 0.01
#define DEAR_COST_IDLE_MIN_BYTES ((size_t)1 << 20)
#define DEAR_COST_IDLE_TOL 0.03

/* Time of one line at a size: alpha + (beta + gamma) * bytes, or for a curve the interpolation
 * between its points: below the first point the first point's time (start-up dominated), above
 * the last at the last point's time per byte. */
double dear_cost_line_eval(const dear_cost_line_t *line, double bytes);
/* Time of op at a size: the auto line when op has one, else the cheapest valid algorithm;
 * stored in *algo when algo != NULL. Returns INFINITY (and algo -1) when no algorithm is valid
 * for op. */
double dear_cost_eval(const dear_cost_model_t *model, dear_coll_op_t op, double bytes, int *algo);
/* Time of op on a float32 vector travelling in format c with `wire` bytes on the wire: its
 * format curve when the model has one, else dear_cost_eval at the wire bytes. */
double dear_cost_eval_fmt(const dear_cost_model_t *model, dear_coll_op_t op, int c, double wire);
/* op's burst curve when the model has one usable (K >= 2, a curve of 2 or more points), else NULL. */
const dear_cost_line_t *dear_cost_burst(const dear_cost_model_t *model, dear_coll_op_t op);
/* What a collective of op and `bytes` (float32 bytes) costs when it starts queued behind others,
 * relative to one run alone: the burst curve over the auto line at that size, from the burst
 * curve's smallest size down (there at the smallest's ratio) to its largest. Beyond the largest,
 * and without a burst curve or an auto line, 1: the runtime then keeps fewer in flight, and no
 * ratio is extrapolated past what was measured. */
double dear_cost_queued_factor(const dear_cost_model_t *model, dear_coll_op_t op, double bytes);
/* op's idle curve when the model has one usable (a curve of 2 or more points), else NULL. */
const dear_cost_line_t *dear_cost_idle(const dear_cost_model_t *model, dear_coll_op_t op);
/* What a collective of op and `bytes` (float32 bytes) costs when it starts on a link idle for
 * DEAR_COST_IDLE_GAP_S, relative to the auto line (back to back): the line's time at the idle
 * curve's smallest size plus the idle curve's least-squares slope for the bytes beyond it, over
 * the line at `bytes`, plus DEAR_COST_IDLE_TOL, and never above 1. Why the slope and not the
 * curve: a network's burst allowance makes every lone collective faster by one fixed time, which
 * training's buckets do not each get, while a queue that back-to-back streams build costs per
 * byte. At or below the smallest size, without an idle curve or an auto line, 1. */
double dear_cost_idle_factor(const dear_cost_model_t *model, dear_coll_op_t op, double bytes);
/* One line standing for op when a planner needs a linear cost (MG-WFBP, DP): the only valid
 * algorithm if there is one, else a relative least-squares line through dear_cost_eval at
 * sizes 4 KiB..256 MiB. DEAR_ERR_ARG when op has no valid algorithm. */
int dear_cost_linear(const dear_cost_model_t *model, dear_coll_op_t op, double *alpha, double *beta);

/* Least-squares fit of seconds = alpha + beta * bytes minimising relative residuals (weights
 * 1/seconds^2), so small and large sizes count alike; alpha and beta are kept >= 0. gamma is
 * folded into beta (0). fit_err = max |predicted - measured| / measured. Needs n >= 2 samples
 * with at least two distinct sizes and positive times; else DEAR_ERR_ARG. */
int dear_cost_fit(const double *bytes, const double *seconds, int n, dear_cost_line_t *line);
/* dear_cost_fit, and the samples kept as the line's curve: one sample per size (distinct
 * sizes, 2..DEAR_COST_MAXPTS of them, else DEAR_ERR_ARG), sorted by size, times made
 * non-decreasing (a larger collective is never cheaper: a dip is measurement noise). fit_err
 * stays the straight line's: how far from linear the cost is. */
int dear_cost_fit_curve(const double *bytes, const double *seconds, int n, dear_cost_line_t *line);

/* Presets: "10gbe" and "ib56" are the MG-WFBP paper's all-reduce fits for P = 8 and 16
 * (docs/DESIGN.md); "shm" is a shared-memory figure for one host (see cost.c). Reduce-scatter and
 * all-gather are taken as half an all-reduce each (alpha/2, beta/2: a ring all-reduce is a
 * reduce-scatter followed by an all-gather of the same volume). The ring algorithm gets the
 * line. For other P the nearest published P is scaled with dear_cost_scale. */
int dear_cost_preset(const char *name, int comm_size, int ranks_per_host, dear_cost_model_t *model);
/* Names of the presets, "|"-separated, for help texts. */
const char *dear_cost_preset_names(void);
/* All-reduce (alpha, beta) given directly; RS and AG as half each; ring algorithm. */
int dear_cost_from_alpha_beta(double alpha, double beta, int comm_size, dear_cost_model_t *model);
/* Scale every line to P workers. Ring model: alpha grows as (P-1) (P-1 sequential steps), beta
 * as 2(P-1)/P for all-reduce and (P-1)/P for reduce-scatter and all-gather (bytes each rank
 * moves per byte of buffer; the ratio is the same for the three). rhd: alpha grows as
 * ceil(log2 P), beta like the ring. mpi and auto: scaled like the ring. A curve's points are
 * scaled as alpha plus the rest: t' = alpha * steps + (t - alpha) * bytes ratio. */
int dear_cost_scale(const dear_cost_model_t *in, int comm_size, dear_cost_model_t *out);

/* Every collective of the model s times dearer: each line, curve and point (the format, burst
 * and idle curves too, so the ratios between them hold). What a model fitted to training's
 * measured iterations applies (dear_sim_fit_scale). */
void dear_cost_mul(dear_cost_model_t *model, double s);

/* Cache file (docs/FORMATS.md). load: fills model with every line stored for
 * (comm_size, ranks_per_host) and sets *found to the number of lines (0: none, model has no
 * valid line); the burst curves (algo auto/K) only for K = inflight (load_ex; none for
 * dear_cost_load or inflight < 2); the idle curves (algo auto@idle) always. A missing file is
 * found = 0, not an error. Bad lines: DEAR_ERR_FORMAT naming file and line. save: merges
 * model's valid lines into the file (replacing the same key), written to a temporary file and
 * renamed. */
int dear_cost_load(const char *path, int comm_size, int ranks_per_host, dear_cost_model_t *model, int *found);
int dear_cost_load_ex(const char *path, int comm_size, int ranks_per_host, int inflight, dear_cost_model_t *model,
                      int *found);
int dear_cost_save(const char *path, const dear_cost_model_t *model);
/* Human-readable table of the valid lines. */
void dear_cost_print(FILE *out, const dear_cost_model_t *model);

#endif

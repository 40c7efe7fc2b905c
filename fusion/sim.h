/*
 * Simulator: one steady-state iteration of a schedule (sync, wfbp, dear) for a profile, a cost
 * function and a plan. Times are seconds from the start of the iteration's forward pass.
 *
 * Model (one compute stream, one FIFO communication channel):
 *   sync: forward, backward, then one all-reduce of every gradient (the plan is not used).
 *   wfbp: all-reduce buckets (plan.rs) are queued as backward completes them (a bucket is
 *         complete when the backward of its first tensor's layer ends) and run in that order;
 *         the next forward starts when backward and every all-reduce are done.
 *   dear: reduce-scatter buckets (plan.rs) are queued as backward completes them; at the end of
 *         backward the all-gather groups (plan.ag) are queued in forward order behind them. They
 *         run during the next forward, whose layer l waits for the all-gather group(s) holding
 *         l's tensors. The early groups (the last plan.ag_early, or those plan.early marks)
 *         instead run during backward, each behind
 *         the reduce-scatter bucket that completes its data (the one holding its first tensor),
 *         in the same FIFO channel. With sharded updates stepped during backward
 *         The iteration is the period of that cycle: the channel state carried from the previous
 *         iteration (its tail, the early groups' ends) is iterated to its fixed point.
 *   dear, sharded (dear_sim_shard_t; runtime/shard.c): a bucket's slices are stepped on the
 *         compute stream, in the order backward completed the buckets, each once its
 *         reduce-scatter is done and taking its tensors' step_s. With DEAR_SIM_SHARD_EARLY a
 *         backward hook (a layer with tensors ends) first queues the buckets it completes, then
 *         steps every bucket whose reduce-scatter has ended, and those steps delay the rest of
 *         backward; an early group leaves when its bucket's step ends. The end of backward steps
 *         the rest, each after its reduce-scatter ends, and the next forward and the regular
 *         all-gathers start after it. Under sync and wfbp step_s is not used (the caller counts
 *         updates as forward compute).
 * Exposed communication = iteration time - (forward + backward compute).
 *
 * Costs come through a function so planners can use anything the runtime can do: the cheapest
 * algorithm per size (dear_sim_cost_model) and a cap on bucket memory (buckets above the cap
 * cost a penalty that dominates any real time) or any other function (the tests' linear one).
 * A collective that was ready while the channel was busy starts queued: the runtime runs it in
 * flight with the ones ahead, and a dense float32 one costs its price times queued_fn (the measured burst curve
 * over the alone curve, where one was measured), so a stream of n small buckets costs what a
 * burst of n costs on the real communicator rather than n collectives timed alone.
 * One that becomes ready after the channel has been idle for DEAR_COST_IDLE_GAP_S starts on an
 * idle link: a dense float32 one costs its price times idle_fn (from the measured idle curve's
 * slope: dear_cost_idle_factor), since its bytes meet no queue that earlier collectives built.
 * Anything else (ready as the channel frees, or after a shorter gap) costs its price.
 * Sparse and compressed tensors (profile.h) are priced by the bytes they put on the wire in each
 * phase (a dense compressed run by its format's cost, fmt_fn, when the cost has one: the measured
 * curve of that format); a sparse reduce-scatter costs the dense price of spread (ranks per host)
 * times its wire bytes, or of its dense bytes where those are fewer: its exchange sends each
 * rank's pieces straight to every other rank, so each host's link carries spread times what the
 * hierarchical dense collective of the same bytes carries across (it combines inside the host
 * first), and the runtime runs the dense algorithm where it would carry less. A sparse
 * all-gather's messages cross once per host (a partner there passes them on), so it costs the
 * dense price of its wire bytes. A group is cut where the block
 * or the formats change, as the runtime cuts it where the block or the type does
 * (dear_sim_ws_group). The runtime also cuts a sparse all-gather group at bucket boundaries;
 * that cut is not priced.
 * Pure C.
 */
#ifndef DEAR_FUSION_SIM_H
#define DEAR_FUSION_SIM_H

#include <stddef.h>
#include <stdio.h>

#include "base/sched_table.h"
#include "fusion/cost.h"
#include "fusion/plan.h"
#include "fusion/profile.h"

/* Seconds for one collective of `bytes` (full buffer). */
typedef double (*dear_sim_cost_fn)(void *arg, dear_coll_op_t op, size_t bytes);
/* Seconds for one collective of a float32 vector travelling in format c (a dear_compress_t other
 * than none), `wire` bytes on the wire. */
typedef double (*dear_sim_cost_fmt_fn)(void *arg, dear_coll_op_t op, size_t wire, int c);
/* Factor on the cost of a collective of `bytes` (dense) that starts queued behind another, i.e.
 * that was ready while the channel was still busy: the runtime keeps several in flight. */
typedef double (*dear_sim_queued_fn)(void *arg, dear_coll_op_t op, size_t bytes);
/* Factor on the cost of a collective of `bytes` (dense) that starts on an idle link. */
typedef double (*dear_sim_idle_fn)(void *arg, dear_coll_op_t op, size_t bytes);
typedef struct {
    dear_sim_cost_fn fn;
    void *arg;
    dear_sim_cost_fmt_fn fmt_fn; /* NULL: fn at the wire bytes */
    dear_sim_queued_fn queued_fn; /* NULL: 1, a queued collective costs what it costs alone */
    dear_sim_idle_fn idle_fn; /* NULL: 1, an idle link changes nothing */
    int spread; /* ranks per host, for sparse reduce-scatters (model above); 0 or 1: one */
} dear_sim_cost_t;

/* arg for dear_sim_cost_model: the cheapest valid algorithm of the model at each size; buckets
 * above cap_bytes (0: no cap) cost DEAR_SIM_CAP_PENALTY_S per cap exceeded. */
#define DEAR_SIM_CAP_PENALTY_S 1000.0
typedef struct {
    const dear_cost_model_t *model;
    size_t cap_bytes;
} dear_sim_model_arg_t;
double dear_sim_cost_model(void *arg, dear_coll_op_t op, size_t bytes);
/* The same for compressed vectors: the model's format curve (dear_cost_eval_fmt). */
double dear_sim_cost_model_fmt(void *arg, dear_coll_op_t op, size_t wire, int c);
/* The model's burst curve over its auto line (dear_cost_queued_factor). */
double dear_sim_cost_model_queued(void *arg, dear_coll_op_t op, size_t bytes);
/* The model's idle curve over its auto line (dear_cost_idle_factor). */
double dear_sim_cost_model_idle(void *arg, dear_coll_op_t op, size_t bytes);
/* The cost of a measured model: marg's model through the four functions above, spread its ranks
 * per host. marg must outlive the result. */
dear_sim_cost_t dear_sim_model_cost(dear_sim_model_arg_t *marg);

/* A recorded operation's kind: a collective (a dear_coll_op_t value), a layer's compute or the
 * sharded step of a bucket's slices. */
enum { DEAR_SIM_FWD = DEAR_COLL_OP_COUNT, DEAR_SIM_BWD, DEAR_SIM_STEP };

typedef struct {
    int kind;           /* dear_coll_op_t, DEAR_SIM_FWD, DEAR_SIM_BWD or DEAR_SIM_STEP */
    int index;          /* profile layer index (FWD, BWD) or group index in its partition (STEP: the
                         * reduce-scatter bucket) */
    double start, end;  /* seconds from the start of the forward pass */
    size_t bytes;       /* communication ops */
} dear_sim_op_t;

typedef struct {
    dear_sched_t sched;
    double iter_s;      /* steady-state iteration time */
    double compute_s;   /* forward + backward compute (dear: + sharded steps) */
    double exposed_s;   /* iter_s - compute_s */
    double comm_s;      /* busy time of the channel per iteration */
    int nops;
    dear_sim_op_t *ops; /* when recorded: every op of the iteration, by start time per stream */
} dear_sim_result_t;

/* Simulate; with record != 0 every operation is stored in res->ops (free with
 * dear_sim_result_free). The profile must have passed dear_prof_check; the plan must fit it. */
int dear_sim_run(const dear_profile_t *prof, const dear_sim_cost_t *cost, dear_sched_t sched,
                 const dear_plan_t *plan, int record, dear_sim_result_t *res);
/* Sharded updates: none, every slice stepped at backward_end, or during backward as soon as its
 * reduce-scatter is done (see the model above). */
typedef enum { DEAR_SIM_SHARD_NONE = 0, DEAR_SIM_SHARD_END, DEAR_SIM_SHARD_EARLY } dear_sim_shard_t;
/* dear_sim_run with sharded updates (a dear_sim_shard_t). */
int dear_sim_run_ex(const dear_profile_t *prof, const dear_sim_cost_t *cost, dear_sched_t sched,
                    const dear_plan_t *plan, int shard, int record, dear_sim_result_t *res);
void dear_sim_result_free(dear_sim_result_t *res);
/* The factor on every collective's price (dear_cost_mul) at which the simulator's iteration of
 * plan is measured_s: within a thousandth, in [1, smax] (1 when cost prices the plan at
 * measured_s or slower, smax when even smax prices it faster). cost must be a measured model's
 * (dear_sim_model_cost; its spread and functions are kept). Why one factor: training measures
 * only how long the plan in force took, and a model fitted to it prices the other plans alike.
 * DEAR_ERR_ARG on bad input. */
int dear_sim_fit_scale(const dear_profile_t *prof, const dear_sim_cost_t *cost, dear_sched_t sched,
                       const dear_plan_t *plan, int shard, double measured_s, double smax, double *scale);

/* Gantt chart of a recorded result as SVG: a compute row and a communication row. */
int dear_sim_svg(const dear_sim_result_t *res, const char *title, FILE *out);

/* Fast path for planners: a workspace with the profile's prefix sums, then the iteration time
 * for partitions given as group starts (first[0..ng], as in dear_partition_t). */
typedef struct dear_sim_ws dear_sim_ws_t;
int dear_sim_ws_create(const dear_profile_t *prof, dear_sim_ws_t **ws);
void dear_sim_ws_free(dear_sim_ws_t *ws);
/* Sharded updates as in dear_sim_run_ex (a dear_sim_shard_t); none when created. */
void dear_sim_ws_set_shard(dear_sim_ws_t *ws, int shard);
double dear_sim_ws_iter(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_sched_t sched, int nrs,
                        const int *rs_first, int nag, const int *ag_first, int ag_early);
/* The same with the early all-gather groups given one by one: early[g] != 0 for each of the nag
 * groups that runs during backward (NULL: the last ag_early, as dear_sim_ws_iter). */
double dear_sim_ws_iter_early(dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_sched_t sched, int nrs,
                              const int *rs_first, int nag, const int *ag_first, int ag_early,
                              const unsigned char *early);
/* Seconds of the collective(s) op of the group of tensors [lo, hi), as the simulator prices it
 * alone (queued, times queued_fn): one collective of its bytes; with sparse tensors one per run of tensors of the same block (the
 * runtime cuts buckets there), a sparse run priced at its wire bytes (dear_prof_wire_bytes, spread
 * as above) and
 * its all-reduce as a reduce-scatter then an all-gather. Non-decreasing as the group grows. */
double dear_sim_ws_group(const dear_sim_ws_t *ws, const dear_sim_cost_t *cost, dear_coll_op_t op, int lo, int hi);
/* Dense bytes of the group [lo, hi) (bucket memory). */
size_t dear_sim_ws_bytes(const dear_sim_ws_t *ws, int lo, int hi);

#endif

/*
 * The runtime's private picture of one context: the tensor registry, layers, reduce-scatter
 * buckets (or all-reduce buckets), all-gather groups, the operations the progress thread runs
 * and the counters. Shared by api.c (init, register, commit, finalize), model.c (registry check
 * across ranks, plan, buckets, fusion buffers), engine.c (the progress thread) and hooks.c (the
 * schedules behind forward_begin / backward_done / backward_end / flush).
 *
 * Threads: the application thread owns everything except the fields marked "shared", which
 * both threads touch under ctx->lock, and the fields marked "engine", which only the progress
 * thread touches after commit.
 */
#ifndef DEAR_RT_H
#define DEAR_RT_H

#include <mpi.h>
#include <pthread.h>
#include <stddef.h>

#include "collectives/coll.h"
#include "fusion/cost.h"
#include "fusion/plan.h"
#include "include/dear.h"
#include "runtime/timeline.h"
#include "runtime/topo.h"

#define DEAR_NAME_MAX 63

typedef enum { DEAR_SCHED_DEAR = 0, DEAR_SCHED_WFBP = 1, DEAR_SCHED_SYNC = 2 } dear_sched_t;

typedef enum { DEAR_OP_IDLE = 0, DEAR_OP_QUEUED, DEAR_OP_RUNNING, DEAR_OP_DONE } dear_op_state_t;

typedef struct {
    char name[DEAR_NAME_MAX + 1];
    int layer;              /* caller's layer id */
    int lidx;               /* index in ctx->layers */
    void *grad;
    size_t count;
    dear_dtype_t dtype;
    size_t bytes;
    dear_update_fn update;
    void *arg;
    int bucket;             /* reduce-scatter / all-reduce bucket holding it */
    size_t off;             /* element offset inside the bucket's vector */
    int pending;            /* averaged gradient in place (or arriving), update not yet run */
} dear_tensor_t;

typedef struct {
    int id;                 /* caller's layer id */
    int t0, t1;             /* tensors [t0, t1) */
    long long bwd_iter;     /* iteration of the last backward_done, -1 before any */
} dear_layer_t;

typedef struct dear_op dear_op_t;
struct dear_op {
    dear_coll_op_t kind;
    int pos;                /* place in one iteration's fixed order of operations */
    int index;              /* bucket (reduce-scatter, all-reduce) or group (all-gather) */
    int layer_lo, layer_hi; /* caller's layer ids covered, for messages */
    size_t bytes;
    dear_coll_args_t args;  /* tag filled when it starts */
    dear_coll_block_t *blocks;
    int ndeps;
    dear_op_t **deps;       /* must be done (same iteration) before this starts */
    /* shared */
    dear_op_state_t state;
    long long iter;         /* iteration it was queued for */
    long long done_iter;    /* iteration of the last completion, -1 before any */
    double t_queued, t_start, t_done;
    /* engine */
    dear_coll_req_t *req;
    size_t last_events;     /* transfers completed at the last poll: a change is progress */
    int stall_warned;
    dear_op_t *next_running;
};

typedef struct {
    int t0, t1;             /* tensors [t0, t1), one dtype */
    size_t count, bytes;
    dear_dtype_t dtype;
    void *buf;              /* the vector the collective runs on */
    int fused;              /* 1: buf is a fusion buffer (pack/unpack); 0: the gradients themselves */
    int remaining;          /* tensors whose layer has not reported backward_done this iteration */
    int early_lo, early_hi; /* dear: early all-gather groups queued behind it (none if lo > hi) */
    dear_op_t op;           /* reduce-scatter (dear) or all-reduce (wfbp, sync) */
} dear_bucket_t;

typedef struct {
    int t0, t1;             /* tensors [t0, t1), in forward order */
    int early;              /* runs during backward, behind the bucket holding t0 (plan.ag_early) */
    int unpacked;           /* data of the pending iteration copied to the gradients */
    dear_op_t op;           /* the all-gather */
} dear_group_t;

typedef struct {
    double *v;
    size_t n, cap;
} dear_samples_t;

struct dear_ctx {
    MPI_Comm comm;          /* private duplicate; only the progress thread uses it after commit */
    int rank, size;
    dear_topo_t topo;
    dear_coll_topo_t *coll_topo; /* hosts of comm for hierarchical collectives; NULL: flat */
    dear_timeline_t *tl;
    dear_sched_t sched;
    int committed;
    int stats_print;
    double stall_warn_s, stall_abort_s;
    int max_inflight;
    size_t inflight_window;     /* DEAR_INFLIGHT_BYTES; 0: no limit */

    /* registry */
    dear_tensor_t *tensors;
    int ntensors, tensors_cap;
    dear_layer_t *layers;
    int nlayers;

    /* plan and its buffers */
    dear_plan_t plan;
    dear_bucket_t *buckets;
    int nbuckets;
    dear_group_t *groups;   /* schedule dear only */
    int ngroups;
    int ngroups_early;      /* of them, run during backward */
    dear_op_t **ops;        /* one iteration's operations in their fixed order */
    int nops;

    /* cost model and online planning (planning.c; the same on every rank) */
    dear_cost_model_t cost;
    int online;             /* a model-driven planner replaces the warm-up plan during training */
    int replan_every;       /* DEAR_REPLAN_EVERY of rank 0 */
    long long next_plan_iter; /* plan at the backward_end that completes this iteration; -1: never */
    int calib_measured;     /* calibrations measured (not loaded from the cache): tests read it */
    int nplans;             /* online plans made */
    int nreverts;           /* online plans dropped after timing (DEAR_VERIFY_ITERS): tests read it */
    int verify_iters;       /* DEAR_VERIFY_ITERS of rank 0; 0 for planners other than auto */
    long long verify_at;    /* verify at the backward_end completing this iteration; -1: nothing to verify */
    dear_plan_t prev_plan;  /* the plan the last switch replaced, while it is being verified */
    double prev_iter_s;     /* its best recent iteration time before the switch (this rank) */
    dear_samples_t verify_times; /* iteration times since the switch (the first one left out) */

    /* iteration state (application thread) */
    long long iter;         /* completed backward_end calls */
    int in_backward;        /* between the first backward_done and backward_end */
    int layers_done;        /* layers reported in this backward */
    int npending;           /* dear: updates of the last backward_end not yet run */
    double t_hook;          /* when the previous hook returned (profile spans) */
    int last_hook_fwd;      /* previous hook was forward_begin of layer last_hook_lidx */
    int last_hook_lidx;
    double t_iter_start;    /* end of the previous backward_end, or 0 after a flush */
    double t_commit;
    dear_samples_t iter_times;
    dear_samples_t *fwd_times, *bwd_times;  /* per layer */
    double blocked_s;

    /* progress thread */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t work_cv; /* wakes the progress thread */
    pthread_cond_t done_cv; /* wakes the application thread */
    /* shared */
    int stop;
    int engine_rc;          /* first error the progress thread hit */
    int nqueued;            /* queued and not yet started */
    int nwaiters;           /* application thread blocked in dear_engine_wait (0 or 1) */
    uint64_t bytes_sent;
    double busbytes;        /* bus bytes (nccl-tests convention) of finished collectives */
    double busy_s;          /* time with at least one collective in flight */
    double progress_cpu_s;
    /* engine */
    long long next_seq;     /* next operation to start: iteration * nops + pos */
    dear_op_t *running;
    int nrunning;
    size_t inflight_bytes;      /* sum of bytes of the running collectives */
    double busy_since;
};

/* model.c */
/* The registered tensors as the fusion layer describes them, in registration order: desc[i]
 * (bytes, layer) and names[i] (pointing into ctx), both allocated; free both. */
int dear_tensor_table(const dear_ctx_t *ctx, dear_tensor_desc_t **desc, const char ***names);
int dear_model_check(dear_ctx_t *ctx);
int dear_model_build(dear_ctx_t *ctx);
void dear_model_free(dear_ctx_t *ctx);
/* Rank 0's status rc0 travels first; then, if it is DEAR_OK, rank 0's plan (set on the other
 * ranks, validated everywhere). Returns rc0 or the broadcast's own error. Collective. */
int dear_model_bcast_plan(dear_ctx_t *ctx, dear_plan_t *plan, int rc0);
/* Replace the plan and rebuild buckets, groups and operations from it; nothing may be in
 * flight and the progress thread must be stopped. Groups are marked unpacked: the caller has
 * already put the pending iteration's data in place. */
int dear_model_rebuild(dear_ctx_t *ctx, const dear_plan_t *plan);
void dear_bucket_pack(const dear_ctx_t *ctx, const dear_bucket_t *b);
void dear_bucket_unpack(const dear_ctx_t *ctx, const dear_bucket_t *b, int t0, int t1);

/* engine.c */
int dear_engine_start(dear_ctx_t *ctx);
void dear_engine_stop(dear_ctx_t *ctx);
/* Queue op for iteration ctx->iter (application thread). */
void dear_engine_queue(dear_ctx_t *ctx, dear_op_t *op);
/* Block until op's collective for iteration iter is done; counts blocked time. */
int dear_engine_wait(dear_ctx_t *ctx, dear_op_t *op, long long iter);

/* planning.c */
/* At commit, before the model is built: decide on online planning and get the cost model
 * (calibration, cache or preset). Collective. */
int dear_planning_setup(dear_ctx_t *ctx);
/* At a backward_end with nothing in flight: plan from the profile and switch. Collective. */
int dear_planning_replan(dear_ctx_t *ctx);
/* At the backward_end of ctx->verify_at, nothing in flight: keep the new plan or go back to the
 * one it replaced, whichever ran faster. Collective. */
int dear_planning_verify(dear_ctx_t *ctx);

/* hooks.c */
int dear_hooks_flush(dear_ctx_t *ctx, const char *call);
void dear_samples_add(dear_samples_t *s, double v);
double dear_samples_median(const dear_samples_t *s);
/* Median of v[0..n) (0 when n is 0); v is left as it was. */
double dear_median(const double *v, size_t n);
/* Smallest of the last k samples (all of them when k >= n), leaving out the very first one while
 * there are others. */
double dear_samples_min_tail(const dear_samples_t *s, size_t k);
void dear_samples_free(dear_samples_t *s);
/* Index in ctx->layers of the caller's layer id, or -1. */
int dear_layer_index(const dear_ctx_t *ctx, int layer);
const char *dear_sched_name(dear_sched_t s);

#endif

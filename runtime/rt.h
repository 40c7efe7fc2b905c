/*
 * The runtime's private picture of one context: the tensor registry, layers, reduce-scatter
 * buckets (or all-reduce buckets), all-gather groups, the operations the progress thread runs
 * and the counters. Shared by api.c (init, commit, finalize), registry.c (registration and its
 * check across ranks), buckets.c (the graph from a plan), planning.c (profiles, online planning),
 * mem.c (gradient data through the memory table), engine.c (the progress thread), iteration.c
 * (the hooks) and the schedules behind them (sched_dear.c, sched_allreduce.c).
 *
 * Threads, in the types: the application thread owns every top-level field; a member struct `sh`
 * is both threads', under ctx->eng.lock; a member struct `pt` is the progress thread's alone
 * while it runs.
 */
#ifndef DEAR_RT_H
#define DEAR_RT_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "collectives/mem.h"
#include "fusion/cost.h"
#include "fusion/plan.h"
#include "fusion/planners.h"
#include "fusion/profile.h"
#include "include/dear.h"
#include "base/sched_table.h"
#include "base/stats.h"
#include "runtime/features.h"
#include "runtime/timeline.h"
#include "runtime/topo.h"

#define DEAR_NAME_MAX 63

typedef enum { DEAR_OP_IDLE = 0, DEAR_OP_QUEUED, DEAR_OP_RUNNING, DEAR_OP_DONE } dear_op_state_t;

typedef struct {
    char name[DEAR_NAME_MAX + 1];
    int layer;              /* caller's layer id */
    int lidx;               /* index in ctx->reg.layers */
    void *grad;
    void *param;            /* dear_set_param; NULL: none given */
    size_t count;
    dear_dtype_t dtype;
    size_t bytes;
    dear_mem_t mem;
    dear_update_fn update;
    void *arg;
    int u0, u1;             /* its units [u0, u1) in ctx->graph.units: more than one when it is cut */
    int pending;            /* averaged gradient in place (or arriving), update not yet run */
    int frozen;             /* dear_freeze: neither communicated nor updated */
    long long nograd_iter;  /* dear_no_grad: the iteration without a gradient here, or -1 */
    int live_ranks;         /* DEAR_FIND_UNUSED: ranks that had a gradient in the last iteration */
    size_t sparse_block;    /* dear_register_sparse: elements per block (a row); 0: dense */
    int sparse_rs, sparse_ag; /* the phases that run sparse (DEAR_SPARSE; auto decides after warm-up) */
    /* Both threads', under the engine's lock: warm-up density (non-zero blocks of this rank's
     * gradient and of the averaged one, out of the blocks scanned) and the counters of the sparse
     * collectives carrying it. */
    struct {
        uint64_t nz_rs, nz_ag, blocks_rs, blocks_ag;
        uint64_t sp_sent, sp_msgs_sparse, sp_msgs_dense;
    } sh;
} dear_tensor_t;

/* DEAR_SPARSE: the table's order. */
typedef enum { DEAR_SPARSE_AUTO = 0, DEAR_SPARSE_ON = 1, DEAR_SPARSE_OFF = 2 } dear_sparse_mode_t;

/* A unit of the plan in force (fusion/units.h: a tensor, or a chunk of one) as the runtime runs
 * it: elements [eoff, eoff + count) of a tensor and their place in the bucket holding them. */
typedef struct {
    int tensor;
    size_t eoff;            /* first element inside the tensor */
    size_t count;           /* elements */
    int bucket;             /* reduce-scatter / all-reduce bucket holding it */
    size_t off;             /* element offset inside the bucket's vector */
    /* Sharded updates: this rank's slice of it, [own_off, own_off + own_len) of the unit (the
     * shard rule over its count, whatever the plan), and where that slice starts in the rank's
     * shard (the slices of every unit back to back). */
    size_t own_off, own_len, own_pos;
} dear_rt_unit_t;

typedef struct {
    int id;                 /* caller's layer id */
    int t0, t1;             /* tensors [t0, t1) */
    int u0, u1;             /* their units [u0, u1) (dear_graph_build) */
    long long bwd_iter;     /* iteration of the last backward_done, -1 before any */
    double flops;           /* its compute hint (dear_set_layer_cost); < 0: none */
} dear_layer_t;

/* A compute hint given before commit, when the layers are not built yet. */
typedef struct {
    int layer;
    double flops;
} dear_layer_hint_t;

typedef struct dear_op dear_op_t;
/* What a feature does on the progress thread around one operation's collective; NULL: nothing. */
typedef struct {
    void (*before)(dear_ctx_t *ctx, dear_op_t *op);
    void (*after)(dear_ctx_t *ctx, dear_op_t *op);
} dear_op_hook_t;
/* Hooks an operation can carry: more than the features that may hook one operation together. */
#define DEAR_OP_HOOKS 4
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
    /* Run by the progress thread right before the collective starts, and right after it ends
     * (before anything depending on it may start), in the order the features added them
     * (dear_op_hook). */
    dear_op_hook_t hooks[DEAR_OP_HOOKS];
    int nhooks;
    /* The memory's part (mem.c), on the progress thread: prepare once the operation is queued,
     * in operation order (packing its bucket); finish after `after` (unpacking). NULL: nothing. */
    int (*prepare)(dear_ctx_t *ctx, dear_op_t *op);
    int (*finish)(dear_ctx_t *ctx, dear_op_t *op);
    /* Both threads', under the engine's lock. */
    struct {
        dear_op_state_t state;  /* a run on the communication queue leaves it RUNNING at its start */
        long long iter;         /* iteration it was queued for */
        long long done_iter;    /* iteration of the last completion, -1 before any */
        long long launch_iter;  /* iteration whose result the memory's fences already order (at the
                                 * completion, or at the start of a collective its transport runs
                                 * on the communication queue), -1 before any */
        double t_queued;
    } sh;
    /* The progress thread's alone. */
    struct {
        long long prep_iter;    /* iteration of the last prepare, -1 before any */
        dear_fence_t *start_fence; /* set by prepare: the collective starts once it is complete */
        int stall_warned;
    } pt;
};

/* A collective in flight (engine.c), the progress thread's: one operation of one iteration. One
 * its transport runs on the communication queue (NCCL) is launched for the application at its
 * start, so its operation may be queued for the next iteration while this run still goes on. */
typedef struct dear_run dear_run_t;
struct dear_run {
    dear_run_t *next;
    dear_op_t *op;
    dear_coll_req_t *req;
    long long iter;
    double t_queued, t_start;
    size_t last_events;     /* transfers completed at the last poll: a change is progress */
    int on_queue;           /* its after and finish ran at its start */
    int stall_warned;
};

typedef struct {
    int u0, u1;             /* units [u0, u1), one dtype */
    size_t count, bytes;
    dear_dtype_t dtype;
    void *buf;              /* the vector the collective runs on */
    int fused;              /* 1: buf is a buffer of its own, a fusion buffer or the host copy of staged
                             * memory (pack/unpack, mem.c); 0: the gradients themselves */
    dear_fence_t *ready;    /* the application wrote the gradients (recorded at backward_done) */
    dear_fence_t *packed;   /* the gradients are in buf */
    dear_fence_t *done;     /* all-reduce: the result is back in the gradients */
    int remaining;          /* units whose layer has not reported backward_done this iteration */
    int early_lo, early_hi; /* dear: the span of the early all-gather groups queued behind it (none if
                             * lo > hi; a group inside it that is not early is skipped) */
    size_t sparse_block;    /* its tensors' block when they are sparse (all alike); 0: dense */
    /* Schedule dear, dense: the bucket's vector cut where all-gather groups begin or end, each
     * piece sharded over every rank on its own (a multi-block reduce-scatter when nsub > 1), so
     * that every group's all-gather is balanced over the ranks. nsub 0: one vector, as sparse
     * buckets and the other schedules run. */
    int nsub;
    dear_coll_block_t *sub;
    /* Sharded updates on staged memory: the host copy of the parameters' vector (the all-gathers'
     * blocks); NULL otherwise (they gather straight into the parameters). */
    void *pbuf;
    dear_op_t op;           /* reduce-scatter (dear) or all-reduce (wfbp, sync) */
} dear_bucket_t;

typedef struct {
    int u0, u1;             /* units [u0, u1), in forward order */
    int early;              /* runs during backward, behind the bucket holding u0 (plan.ag_early) */
    int unpacked;           /* data of the pending iteration copied to the gradients */
    dear_fence_t *packed;   /* sharded updates, staged: this rank's parameters are in the buckets' pbuf */
    dear_fence_t *done;     /* its units are back in the gradients (sharded updates: parameters) */
    dear_op_t op;           /* the all-gather */
} dear_group_t;

/* The context's communicator, its hosts and what carries its collectives (api.c, at
 * dear_init). Read-only afterwards; after commit only the progress thread uses comm for
 * collectives, and the application thread only for calls that run while it is stopped or quiet
 * (plan switches, finalize). */
typedef struct {
    MPI_Comm comm;          /* private duplicate */
    int rank, size;
    dear_topo_t topo;
    dear_coll_topo_t *coll_topo; /* hosts of comm for hierarchical collectives; NULL: flat */
    dear_transport_t *tp;   /* what carries the collectives (DEAR_TRANSPORT) */
    dear_net_t *net;        /* comm on tp */
    int keep;               /* some rank left a collective unfinished, so messages may be unmatched:
                             * the communicators are never freed (dear_coll_topo_free) */
} dear_rt_comm_t;

/* Settings read at dear_init from the DEAR_* table (api.c); read-only afterwards. */
typedef struct {
    dear_sched_t sched;
    const struct dear_sched_ops *sched_ops; /* sched's row of DEAR_SCHED_TABLE (below) */
    int stats_print;
    double stall_warn_s, stall_abort_s;
    int max_inflight;
    size_t inflight_window; /* DEAR_INFLIGHT_BYTES; 0: no limit */
} dear_rt_cfg_t;

/* The registry: tensors in registration (forward) order, grouped into layers (registry.c).
 * Built by the application thread before commit; afterwards the tensors' `sh` is the progress
 * thread's too (under the engine's lock). */
typedef struct {
    dear_tensor_t *tensors;
    int ntensors, tensors_cap;
    dear_layer_t *layers;
    int nlayers;
    int *declared;          /* dear_register_layer's ids: layers that may hold no tensor */
    int ndeclared, declared_cap;
    dear_layer_hint_t *hints; /* dear_set_layer_cost before commit, in call order */
    int nhints, hints_cap;
} dear_registry_t;

/* The plan in force and what it became: its units, buckets, all-gather groups, one iteration's
 * operations in their fixed order (buckets.c). Built by the application thread while the
 * progress thread is stopped; the operations' fields are then shared as dear_op_t says. */
typedef struct {
    dear_plan_t plan;
    dear_rt_unit_t *units;
    int nunits;
    dear_bucket_t *buckets;
    int nbuckets;
    dear_group_t *groups;   /* schedule dear only */
    int ngroups;
    int ngroups_early;      /* of them, run during backward */
    dear_op_t **ops;
    int nops;
    /* The features' operations between the reduce-scatters and the all-gathers (the count of
     * ranks with a gradient, the norm), in the order they were added (dear_graph_barrier): every
     * all-gather but the early ones waits for them, and so does every update. */
    dear_op_t *barrier[DEAR_FEAT_COUNT];
    int nbarriers;
    unsigned gen;           /* graphs built so far: a change says the plan in force changed */
} dear_graph_t;

/* DEAR_FIRST_PLAN: the table's order. */
typedef enum { DEAR_FIRST_RANGE = 0, DEAR_FIRST_FIRST = 1, DEAR_FIRST_THRESHOLD = 2 } dear_first_plan_t;
/* DEAR_COST_REFIT: the table's order. */
typedef enum { DEAR_REFIT_OFF = 0, DEAR_REFIT_PREDICT = 1, DEAR_REFIT_PLAN = 2 } dear_refit_t;

/* The cost model and online planning (calibrate.c, planning.c): the same on every rank, the
 * application thread's (plans switch with the progress thread stopped). */
typedef struct {
    dear_cost_model_t cost;
    int enabled;            /* a model-driven planner replaces the warm-up plan during training */
    int replan_every;       /* DEAR_REPLAN_EVERY of rank 0 */
    long long next_plan_iter; /* plan at the backward_end that completes this iteration; -1: never */
    int first_plan;         /* DEAR_FIRST_PLAN of rank 0: DEAR_FIRST_* */
    double min_gain;        /* DEAR_REPLAN_MIN_GAIN (rank 0 uses its own) */
    double first_min_gain;  /* DEAR_FIRST_MIN_GAIN (rank 0 uses its own) */
    long long rescale_at;   /* DEAR_FIRST_PLAN=first: re-plan the estimate at the backward_end completing this
                             * iteration with its measured times; -1: not (again) */
    int calib_measured;     /* calibrations measured (not loaded from the cache): tests read it */
    int nplans;             /* online plans made */
    /* The plan in force's iteration times since it went in force (the first after the switch
     * left out): what online planning fits the cost model to (DEAR_COST_REFIT). */
    dear_samples_t in_force;
    unsigned in_force_gen;  /* the graph they were timed on (dear_graph_t.gen) */
    int refit;              /* DEAR_COST_REFIT of rank 0: DEAR_REFIT_* */
    /* The last fit, every rank's: the factor on the calibrated model, the measured iteration it
     * matched and the calibrated model's price of it (1, 0, 0: none yet). */
    double fit_scale, fit_measured_s, fit_pred_s;
} dear_online_t;

/* auto's check of a plan it switched to (planning.c), the application thread's: blocks new,
 * old, new, each one settling iteration left out and then len timed ones. */
typedef struct {
    int iters;              /* DEAR_VERIFY_ITERS of rank 0; 0 for planners other than auto */
    double margin;          /* DEAR_VERIFY_MARGIN of rank 0 */
    long long at;           /* the current block ends at the backward_end completing this iteration; -1: no check */
    int block;              /* 0, 1, 2: which block runs (1: the old plan) */
    int len;                /* timed iterations of the current block */
    dear_plan_t alt_plan;   /* during a check, the one of the two plans not in force */
    double pred_s[2];       /* rank 0: predicted iteration time of the old [0] and the new [1] plan */
    double *samples;        /* this rank's timed iterations: old plan [0, iters), new plan after */
    int n[2];               /* timed iterations so far of the old and the new plan */
    int nreverts;           /* plans dropped after timing: tests read it */
    int tries;              /* DEAR_VERIFY_TRIES of rank 0: plans timed at most per re-plan */
    int tried;              /* plans timed since the last re-plan (the current one counted) */
    /* rank 0: auto's runners-up of the last re-plan, fastest predicted first, timed in turn
     * while each plan loses to the plan in force */
    dear_plan_t runners[DEAR_AUTO_MAX_RUNNERS];
    double runner_pred[DEAR_AUTO_MAX_RUNNERS];
    int nrunners, next_runner;
    /* rank 0: the plan tied with auto's plan of the last re-plan (nunits 0: none), timed against
     * it once the plan stays */
    dear_plan_t tie;
    double tie_pred;
    int in_tie;             /* the check running times that tied plan (every rank) */
} dear_check_t;

/* Iteration state and the profile it gives (iteration.c): the application thread's. */
typedef struct {
    long long iter;         /* completed backward_end calls */
    int in_backward;        /* between the first backward_done and backward_end */
    int layers_done;        /* layers reported in this backward */
    int npending;           /* dear: updates of the last backward_end not yet run */
    /* dear: forward_begin's scan ran every update of layers [scan_lo, scan_hi) in iteration
     * scan_iter, so a later forward_begin within them resumes it at scan_hi (linear, not
     * quadratic, in a group's layers). */
    int scan_lo, scan_hi;
    long long scan_iter;
    dear_mode_t mode;       /* dear_set_mode */
    double t_hook;          /* when the previous hook returned (profile spans) */
    int last_hook_fwd;      /* previous hook was forward_begin of layer last_hook_lidx */
    int last_hook_lidx;
    double t_iter_start;    /* end of the previous backward_end, or 0 after a flush */
    double outside_s;       /* this iteration's time from that end to its first forward hook: the
                             * program's own (data, its optimizer), which no profile holds */
    int accumulated;        /* this iteration ran DEAR_MODE_ACCUMULATE passes, which no profile holds */
    double t_commit;
    dear_samples_t iter_times;
    dear_samples_t *fwd_times, *bwd_times;  /* per layer */
    /* Per layer: the update callbacks' time, one sample per iteration they ran for (upd_sum
     * gathers the iteration upd_iter until an update of a later one closes it). */
    dear_samples_t *upd_times;
    double *upd_sum;
    long long *upd_iter;
    double blocked_s;
} dear_iter_t;

/* Tensors without a gradient in an iteration (unused.c). The application thread writes the
 * marks; the progress thread runs the count in the operation's hooks. */
typedef struct {
    int on;                 /* DEAR_FIND_UNUSED, rank 0's, fixed at commit */
    int32_t *live;          /* per tensor: 1 if this rank had a gradient; summed over ranks */
    dear_op_t op;           /* that sum, a collective of the plan */
} dear_unused_t;

/* Clipping by global norm (clip.c). Under dear the progress thread takes the squares and the
 * norm in the operations' hooks, and the application thread reads the result once the
 * all-gathers it waits for are done; under wfbp and sync all of it is the application thread's. */
typedef struct {
    int on;                 /* fixed at commit: the norm's collective is part of the plan */
    double max_norm;        /* INFINITY: the norm is reported, nothing is clipped */
    int *part0;             /* dear: bucket b's shard parts are [part0[b], part0[b + 1]) */
    double *part_sq;        /* per part (dear) or per tensor (wfbp, sync): a squared norm */
    dear_fence_t *sq_fence; /* the squares are written (the norm's collective waits for it) */
    int failed;             /* a square could not be taken (progress thread) */
    double sum;             /* the norm collective's vector: the squared norm, summed over ranks */
    /* DEAR_DETERMINISTIC: the squares added exactly (base/xsum.h), so that the norm does not depend
     * on how plan and ranks split the elements; the collective sums the exported words instead */
    struct dear_xsum_s *xs;
    double *words;
    dear_op_t op;           /* dear: that collective, between the reduce-scatters and all-gathers */
    double norm, coef;      /* of the gradient of iteration `iter` */
    long long iter;
} dear_clip_t;

/* Sharded updates (shard.c): fixed at commit, the application thread's. */
typedef struct {
    int on;                 /* each rank updates its slices; the all-gathers carry parameters */
    int hold;               /* DEAR_SHARD_HOLD: they wait for dear_shard_release */
    int flags;              /* dear_set_shard's, before commit */
    int held;               /* the all-gathers of the last backward_end are not queued yet */
    int switch_due;         /* a plan switch waits for them: its dear_switch_t + 1 (0: none) */
    dear_fence_t *updated;  /* the application's queue ran the updates (the all-gathers wait) */
    int early;              /* DEAR_SHARD_EARLY under dear, not held: slices may be stepped in backward */
    long long step_iter;    /* the iteration step_next counts in */
    int step_next;          /* the next bucket, in backward order, whose slices are not stepped yet */
    dear_fence_t **stepped; /* per bucket: the application's queue stepped its slices (early groups wait) */
    int nstepped;
} dear_shard_t;

/* Sparse tensors (sparse.c): fixed at commit, the application thread's. */
typedef struct {
    int mode;               /* DEAR_SPARSE of rank 0, fixed at commit */
    long long measure_iters; /* densities are measured in iterations below this (rank 0's warm-up) */
    long long decide_at;    /* auto: decide at the backward_end completing this iteration; -1: never */
    int rs_only;            /* sharded updates: the all-gathers carry parameters and run dense */
} dear_sparse_ctl_t;

/* Compression of float32 gradients (compress.c): fixed at commit, the same on every rank. */
typedef struct {
    int set;                /* dear_set_compress was called: the environment is not read */
    dear_compress_t rs, ag; /* the formats of the reduce-scatters (all-reduces) and the all-gathers */
    int ef;                 /* error feedback */
    float *resid;           /* error feedback: per element of the float32 tensors, what rounding this
                             * rank's gradient dropped (the buckets' memory); the progress thread's */
    size_t *resid_off;      /* per tensor: its first element in resid (SIZE_MAX: not float32) */
    float *resid8;          /* int8 error feedback: per element of the dense float32 buckets, in their
                             * layout (the collectives' ef) and memory, zero at each graph build; the progress
                             * thread's through the collectives */
} dear_compress_ctl_t;

/* The deterministic mode (determ.c): DEAR_DETERMINISTIC, agreed by every rank at dear_init. */
typedef struct {
    int on;
} dear_determ_t;

/* The check for non-finite gradients (finite.c): rank 0's DEAR_CHECK_FINITE, fixed at commit.
 * Built with the graph by the application thread; then the progress thread's (the hooks). */
#define DEAR_FINITE_SLOTS 4
typedef struct {
    double *sq;                 /* per slot, per unit of the bucket: its squared norm (host memory of
                                 * the row); device queues use the slots in turn */
    dear_fence_t *fence[DEAR_FINITE_SLOTS]; /* device queues: the slot's squares are written */
    long long iter[DEAR_FINITE_SLOTS];      /* device queues: the iteration whose squares wait in the
                                             * slot, or -1 */
} dear_finite_bucket_t;

typedef struct {
    int mode;                   /* DEAR_CHECK_FINITE: off, warn, abort */
    int reports;                /* iterations reported (warn stops at a bound) */
    long long unchecked;        /* device queues: reduce-scatters not checked, every slot still queued */
    dear_finite_bucket_t *b;    /* per bucket */
    int nb;
} dear_finite_t;

/* Partitions (partition.c): rank 0's DEAR_PARTITION, fixed at commit. */
typedef struct {
    size_t bytes;           /* the largest unit a tensor is cut into */
    int on;                 /* some registered tensor is larger, so it is cut */
} dear_partition_ctl_t;

/* The progress thread (engine.c): its thread, lock and conditions (set up and torn down by the
 * application thread), `sh` under the lock, `pt` its own. */
typedef struct {
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t work_cv; /* wakes the progress thread */
    pthread_cond_t done_cv; /* wakes the application thread */
    int sync_ready;         /* the three above exist */
    /* Both threads', under lock. */
    struct {
        int stop;
        int rc;                 /* first error the progress thread hit */
        int nqueued;            /* queued and not yet started */
        const dear_op_t *wait_op; /* what the blocked application thread waits for (NULL: none) */
        int in_net_wait;        /* the progress thread sleeps in the transport's block: poke to wake it */
        uint64_t bytes_sent;
        double busbytes;        /* bus bytes (nccl-tests convention) of finished collectives */
        double busy_s;          /* time with at least one collective in flight */
        double progress_cpu_s;
    } sh;
    /* The progress thread's alone while it runs (the application thread's after the join). */
    struct {
        long long next_seq;     /* next operation to start: iteration * nops + pos */
        long long next_prep;    /* next operation to prepare (never behind next_seq) */
        int fence_wait;         /* the next operation waits for its buffer to fill (polled) */
        dear_run_t *running;
        dear_run_t *spare;      /* runs ended, for reuse */
        int abandoned;          /* collectives were in flight when the thread stopped (read after join) */
        dear_run_t *parked;     /* those collectives, receives cancelled, until dear_finalize settles
                                 * them (the application thread's after join) */
        int nrunning;
        int nhost;              /* of them, those on the host (DEAR_MAX_INFLIGHT counts these) */
        size_t inflight_bytes;  /* sum of bytes of the running collectives on the host */
        double busy_since;
    } pt;
} dear_engine_t;

/* Where the gradients live and the queues that reach them (mem.c). */
typedef struct {
    const dear_mem_ops_t *ops;  /* the gradients' row of the memory table */
    int staged;                 /* the collectives run on host copies (ops has DEAR_MEM_F_STAGE) */
    dear_memq_t *app;           /* where the application writes and reads gradients (NULL: its thread) */
    dear_memq_t *comm;          /* communication's copies; only the progress thread enqueues on it */
    dear_mem_t kind;            /* the kind of memory the gradients lie in (its row in mem.c) */
    dear_fence_t *idle;         /* the communication queue's work so far, waited for before buffers go */
    int drop;                   /* DEAR_DEBUG_DROP_WAIT: the wait left out (tests of the fences) */
    void *stream;               /* dear_set_stream: the application's CUDA stream (NULL: legacy default) */
    struct dear_cuda *cuda;     /* CUDA gradients: the device side (cuda/cuda.h); NULL for host memory */
    dear_net_t *net;            /* the transport that runs the gradients' collectives itself (NCCL),
                                 * or NULL: the context's (cm.net), on host buffers */
} dear_rt_mem_t;

/* One context, split by concern. In every part the application thread owns the top-level fields;
 * a member `sh` is both threads' under the engine's lock, a member `pt` the progress thread's. */
struct dear_ctx {
    dear_rt_comm_t cm;
    dear_rt_cfg_t cfg;
    dear_rt_mem_t mem;
    dear_timeline_t *tl;    /* its own lock: any thread */
    int committed;
    atomic_int hook_busy;   /* a call runs now (dear_rt_claim): one at a time, whatever the thread */
    pthread_t hook_owner;   /* the thread of the last call that claimed it (for messages) */
    dear_registry_t reg;
    dear_graph_t graph;
    dear_online_t online;
    dear_check_t check;
    dear_iter_t it;
    dear_unused_t unused;
    dear_clip_t clip;
    dear_sparse_ctl_t sparse;
    dear_shard_t shard;
    dear_compress_ctl_t comp;
    dear_determ_t determ;
    dear_partition_ctl_t part;
    dear_finite_t finite;
    dear_engine_t eng;
};

/* What a schedule does at each hook (one row of DEAR_SCHED_TABLE, base/sched_table.h). A NULL
 * entry does nothing. */
typedef struct dear_sched_ops {
    dear_coll_op_t bucket_op;   /* what a bucket's operation is: reduce-scatter or all-reduce */
    /* dear_forward_begin of layer lidx, after the common checks: its updates, if pending */
    int (*forward_layer)(dear_ctx_t *ctx, int lidx);
    /* backward completed bucket b, its data marked ready for the progress thread (mem.c) */
    void (*bucket_done)(dear_ctx_t *ctx, dear_bucket_t *b);
    /* dear_backward_end, every layer reported */
    int (*backward_end)(dear_ctx_t *ctx);
    /* complete everything pending and run the pending updates (call names the caller) */
    int (*flush)(dear_ctx_t *ctx, const char *call);
    /* before a plan switch: nothing of this iteration's collectives still in flight */
    int (*drain)(dear_ctx_t *ctx);
    /* dear_wait_grad: layer lidx's averaged gradients in place, its updates left pending */
    int (*wait_layer)(dear_ctx_t *ctx, int lidx);
} dear_sched_ops_t;

#define SCHED_OPS_DECL_(ID, NAME, OPS, SIM, FLAGS, HELP) extern const dear_sched_ops_t OPS;
DEAR_SCHED_TABLE(SCHED_OPS_DECL_)
#undef SCHED_OPS_DECL_

/* registry.c */
void dear_registry_free_layers(dear_registry_t *reg);
/* The layers of the registered tensors and the declared ones (dear_commit). */
int dear_registry_build_layers(dear_registry_t *reg);
/* Collective: DEAR_ERR_MISMATCH on every rank, naming the first difference, unless every rank has
 * the same layers. */
int dear_registry_check_layers(const dear_rt_comm_t *cm, const dear_registry_t *reg);
/* Collective: DEAR_ERR_MISMATCH on every rank, naming the first difference, unless every rank
 * registered the same tensors. */
int dear_registry_check(const dear_rt_comm_t *cm, dear_registry_t *reg);
/* The registered tensors as the fusion layer describes them, in registration order: desc[i]
 * (bytes, layer, element size, the row of a sparse one) and names[i] (pointing into ctx), both
 * allocated; free both. */
int dear_tensor_table(const dear_ctx_t *ctx, dear_tensor_desc_t **desc, const char ***names);
/* Index in ctx->reg.layers of the caller's layer id, or -1. */
int dear_layer_index(const dear_registry_t *reg, int layer);

/* buckets.c */
/* Buckets, groups, fusion buffers and the operation order of ctx->graph.plan. */
int dear_graph_build(dear_ctx_t *ctx);
/* Replace the plan and rebuild buckets, groups and operations from it; nothing may be in
 * flight and the progress thread must be stopped. Groups are marked unpacked: the caller has
 * already put the pending iteration's data in place. */
int dear_graph_rebuild(dear_ctx_t *ctx, const dear_plan_t *plan);
void dear_graph_free(dear_ctx_t *ctx);
/* op: a plain sum (all-reduce, scale 1) of count elements of buf, over every tensor's layers, at
 * place pos of the iteration; index names it in messages (< 0: not a bucket or group). */
void dear_op_sum(dear_ctx_t *ctx, dear_op_t *op, int pos, int index, dear_dtype_t dtype, void *buf, size_t count);

/* A feature's step around op's collective on the progress thread (dear_op_hook_t). */
int dear_op_hook(dear_op_t *op, void (*before)(dear_ctx_t *, dear_op_t *), void (*after)(dear_ctx_t *, dear_op_t *));
/* A feature's graph step: op runs after every reduce-scatter and before every all-gather that is
 * not early; every update waits for it. */
void dear_graph_barrier(dear_ctx_t *ctx, dear_op_t *op);
/* Queue the barriers for this iteration (backward_end), or wait for them for iteration iter. */
void dear_graph_queue_barriers(dear_ctx_t *ctx);
int dear_graph_wait_barriers(dear_ctx_t *ctx, long long iter);

/* This rank's reduce-scatter shard of bucket b comes in dear_bucket_parts(b) parts (one unless
 * the bucket is sharded piece by piece); part k's start, and its length in elements. */
static inline int dear_bucket_parts(const dear_bucket_t *b) { return b->nsub > 0 ? b->nsub : 1; }
char *dear_bucket_own(const dear_rt_comm_t *cm, const dear_bucket_t *b, int k, size_t *len);
/* Elements unit u contributes to its bucket's vector (none when its tensor is frozen). */
size_t dear_unit_ccount(const dear_graph_t *g, const dear_registry_t *reg, int u);
/* Where unit u's gradient (params 0) or parameters (params 1) lie for the collectives: in its
 * bucket's buffer when the bucket has one of its own (fused), else in place. The one rule for
 * finding a unit's data in a bucket: a bucket's buf + off holds only for a fused bucket. */
char *dear_unit_vec(const dear_ctx_t *ctx, int u, int params);
/* Where unit u's data lies in the gradient of its tensor. */
char *dear_unit_grad(const dear_graph_t *g, const dear_registry_t *reg, int u);
/* The all-gather group holding unit u (schedule dear). */
int dear_group_of(const dear_graph_t *g, int u);

/* iteration.c: every call that reads or changes a context after dear_init, bar the getters of
 * what init fixed, claims it for its duration; one made while another runs fails at once with
 * DEAR_ERR_STATE, naming why, and touches nothing. */
int dear_rt_claim(dear_ctx_t *ctx, const char *call);
void dear_rt_release(dear_ctx_t *ctx);
/* The body of public call `call`: claim, return expr's status, release. */
#define DEAR_CLAIMED(ctx, call, expr)                                                          \
    do {                                                                                       \
        int claim_rc_ = dear_rt_claim((ctx), (call));                                          \
        if (claim_rc_ != DEAR_OK)                                                              \
            return claim_rc_;                                                                  \
        claim_rc_ = (expr);                                                                    \
        dear_rt_release(ctx);                                                                  \
        return claim_rc_;                                                                      \
    } while (0)

/* mem.c */
/* Tests only: the row of host gradients (NULL: the host row), e.g. one that delays its queues. */
void dear_rt_mem_set_host_row(const dear_mem_ops_t *ops);
/* A kind of memory dear knows; otherwise an error naming call, the tensor and the accepted kinds. */
int dear_rt_mem_kind_valid(const char *call, const char *name, dear_mem_t kind);
/* The registry's check that p (bytes, what: "grad" or "param") lies where kind says, naming call
 * and the tensor in its error. */
int dear_rt_mem_check(const char *call, const char *name, const char *what, const void *p, size_t bytes,
                      dear_mem_t kind);
/* "DEAR_MEM_HOST", ...; "unknown" out of range. */
const char *dear_rt_mem_kind_name(dear_mem_t kind);
/* The CUDA stream the updates run on, where the gradients' kind has one (NULL otherwise). */
void *dear_rt_mem_stream(const dear_ctx_t *ctx);
/* At commit: the gradients' kind opened (its row of the memory table, its queues) and
 * DEAR_DEBUG_DROP_WAIT. */
int dear_rt_mem_setup(dear_ctx_t *ctx);
void dear_rt_mem_free(dear_ctx_t *ctx);
/* Wait (host) until nothing enqueued on the communication queue still runs. */
int dear_rt_mem_quiesce(const dear_ctx_t *ctx);
/* dear_graph_build: the fences of buckets and groups and the operations' prepare and finish. */
int dear_rt_mem_graph(dear_ctx_t *ctx);
/* Sharded updates: this rank's reduced slices of bucket b back in the gradients (from a staged
 * copy), then its `done` fence, on the communication queue. */
int dear_rt_shard_unpack(const dear_ctx_t *ctx, dear_bucket_t *b);
void dear_rt_mem_graph_free(dear_ctx_t *ctx);
int dear_rt_fence_new(const dear_ctx_t *ctx, dear_fence_t **f);
void dear_rt_fence_free(const dear_ctx_t *ctx, dear_fence_t *f);
/* backward_done completed bucket b: its `ready` fence on the application's queue. */
int dear_rt_bucket_ready(const dear_ctx_t *ctx, dear_bucket_t *b);
/* The application's queue waits for a group's or bucket's `done` (forward_begin, backward_end). */
int dear_rt_wait_done(const dear_ctx_t *ctx, dear_fence_t *done);
/* *ready = 1 once the `done` fence is complete, without waiting (a hook's test). */
int dear_rt_done_query(const dear_ctx_t *ctx, dear_fence_t *done, int *ready);
/* This rank's zeros for a gradient, on the application's queue (dear_no_grad). */
int dear_rt_zero(const dear_ctx_t *ctx, void *grad, size_t bytes);
/* The row and queue of the buckets' buffers: the host's for staged memory, else the gradients'. */
static inline const dear_mem_ops_t *dear_rt_work_ops(const dear_ctx_t *ctx)
{
    return ctx->mem.staged ? &dear_mem_host_ops : ctx->mem.ops;
}
static inline dear_memq_t *dear_rt_work_queue(const dear_ctx_t *ctx)
{
    return ctx->mem.staged ? NULL : ctx->mem.comm;
}
/* The net the gradients' collectives run on: the memory's own transport (NCCL) where it has one. */
static inline dear_net_t *dear_rt_work_net(const dear_ctx_t *ctx)
{
    return ctx->mem.net ? ctx->mem.net : ctx->cm.net;
}

/* engine.c */
int dear_engine_start(dear_ctx_t *ctx);
void dear_engine_stop(dear_ctx_t *ctx);
/* Queue op for iteration ctx->it.iter (application thread). */
void dear_engine_queue(dear_ctx_t *ctx, dear_op_t *op);
/* Queue op for iteration iter (the held all-gathers of sharded updates, after backward_end). */
void dear_engine_queue_at(dear_ctx_t *ctx, dear_op_t *op, long long iter);
/* Block until op's result for iteration iter is ordered by the memory's fences (its collective
 * done, or running on the communication queue ahead of its `done` fence); counts blocked time. */
int dear_engine_wait(dear_ctx_t *ctx, dear_op_t *op, long long iter);
/* Whether op of iteration iter is done, without waiting (what dear_engine_wait waits for). */
int dear_engine_done(dear_ctx_t *ctx, const dear_op_t *op, long long iter);

/* calibrate.c */
/* The cost model, the same on every rank: measured (or from DEAR_CALIBRATION_FILE) when
 * calibrate_on, else DEAR_COST_PRESET. Collective. */
int dear_cost_setup(dear_ctx_t *ctx, int calibrate_on);

/* planning.c */
/* At commit, before the plan is made: decide on online planning and get the cost model.
 * Collective. */
int dear_planning_setup(dear_ctx_t *ctx);
/* At commit: rank 0 makes the plan in force until online planning replaces it (DEAR_PLAN_FILE,
 * the one bucket of sync, none, threshold, or the estimate of DEAR_FIRST_PLAN) and every rank
 * receives it. Collective. */
int dear_planning_initial(dear_ctx_t *ctx);
/* Rank 0's status rc0 travels first; then, if it is DEAR_OK, rank 0's plan (set on the other
 * ranks, validated everywhere). Returns rc0 or the broadcast's own error. Collective. */
int dear_planning_bcast(dear_ctx_t *ctx, dear_plan_t *plan, int rc0);
/* After a plan switch, check or freeze (the progress thread stopped): a failure rc stops the
 * context (later hooks say so); otherwise the progress thread restarts with the operation order
 * in place, from this iteration on every rank. Returns rc or the restart's error. */
int dear_planning_restart(dear_ctx_t *ctx, int rc);
/* At a backward_end with nothing in flight: plan from the profile and switch. Collective. */
int dear_planning_replan(dear_ctx_t *ctx);
/* At the first backward_end with nothing in flight (DEAR_FIRST_PLAN=first): plan the estimate
 * again with the first iteration's measured times and switch, without auto's check. Collective. */
int dear_planning_rescale(dear_ctx_t *ctx);
/* At the backward_end of ctx->check.at, nothing in flight: switch to the other plan for
 * the next block of the check or, after the last, keep the plan the measurement (or, when it is
 * inconclusive, the model) says is faster. Collective. */
int dear_planning_verify(dear_ctx_t *ctx);
/* The plans online planning and auto's check hold (the check's other plan, the runners-up). */
void dear_planning_free(dear_ctx_t *ctx);
/* This rank's time of the iteration just completed, for the check when one runs; plan_s, the
 * part the plan's model prices (the program's time outside the hooks left out; 0: none, the
 * iteration ran passes no profile holds), for the fit of the cost model. */
void dear_planning_sample(dear_ctx_t *ctx, double iter_s, double plan_s);

/* The features' narrow functions: what another file may ask of a feature (features.h). Each
 * file's state is its own; nothing else reads its fields. */

/* unused.c */
/* Whether tensor t's update runs for the last iteration: not frozen, and with a gradient on some
 * rank when DEAR_FIND_UNUSED is on. */
int dear_tensor_updates(const dear_ctx_t *ctx, int t);

/* Whether DEAR_FIND_UNUSED counts the ranks with a gradient (a barrier before every update). */
int dear_unused_on(const dear_ctx_t *ctx);

/* clip.c */
int dear_clip_on(const dear_ctx_t *ctx);
/* The norm and factor of iteration's gradient; 0 when clipping gave none for it. */
int dear_clip_result(const dear_ctx_t *ctx, long long iteration, double *norm, double *coef);
/* wfbp, sync: the norm of the averaged gradients in place, and the clipping. */
int dear_clip_averaged(dear_ctx_t *ctx);

/* sparse.c */
/* dear_get_sparse_stats for a caller that holds the claim (dear_finalize's statistics). */
int dear_sparse_stats_claimed(dear_ctx_t *ctx, int tensor, dear_sparse_stats_t *stats);
/* The block a tensor travels with: its declared one unless sparse tensors travel dense. */
size_t dear_tensor_block(const dear_ctx_t *ctx, int t);
/* Whether any tensor travels with a block (the sparse feature is on): its all-reduce then runs
 * as a sparse reduce-scatter and all-gather. */
int dear_sparse_any(const dear_ctx_t *ctx);
/* Under the lock: a finished collective's sparse counters into its tensors. */
void dear_sparse_record(dear_ctx_t *ctx, const dear_op_t *op, const dear_coll_info_t *info);
/* "reduce-scatter sparse, all-gather dense" or "all-reduce sparse", in buf, for messages. */
const char *dear_sparse_phases(const dear_ctx_t *ctx, int rs, int ag, char *buf, size_t len);
/* Whether DEAR_SPARSE=auto decides at this backward_end. */
int dear_sparse_due(const dear_ctx_t *ctx);
/* DEAR_SPARSE=auto at the backward_end dear_sparse_due names: drain, agree on the densities and
 * keep the sparse form of each phase only where it sends fewer bytes. Collective. */
int dear_sparse_decide(dear_ctx_t *ctx);

/* sched_dear.c */
/* Group g's data of the pending iteration (ctx->it.iter - 1) in place: its all-gather waited for,
 * then its `done` fence on the application's queue; lidx names the layer in the timeline (-1). */
int dear_group_ready(dear_ctx_t *ctx, int g, const char *call, int lidx);

/* shard.c */
int dear_shard_on(const dear_ctx_t *ctx);
/* DEAR_SHARD_HOLD: the program steps its slices and releases the all-gathers itself. */
int dear_shard_holds(const dear_ctx_t *ctx);
/* The all-gathers of the last backward_end wait for dear_shard_release. */
int dear_shard_held(const dear_ctx_t *ctx);
/* The application's queue ran the slice updates all-gather group g sends: the group waits for it. */
dear_fence_t *dear_shard_updated(const dear_ctx_t *ctx, int g);
/* Slices are stepped during backward (DEAR_SHARD_EARLY under dear, not held, no clipping or
 * count of ranks with a gradient): the plan may gather parameters early. */
int dear_shard_steps_early(const dear_ctx_t *ctx);
/* At a backward hook: the slices of the buckets whose reduce-scatters are done, in the order
 * backward completed them, stepped without waiting; each bucket's early groups then queued. */
int dear_shard_step_ready(dear_ctx_t *ctx);
/* The schedule is run as reduce-scatter, update, all-gather: DEAR_SCHED_F_SPLIT or sharded. */
int dear_rt_split(const dear_ctx_t *ctx);
/* backward_end of every schedule under sharded updates: the reduce-scatters waited for, each
 * slice's update run, the all-gathers held. */
int dear_shard_backward_end(dear_ctx_t *ctx);
/* Queue the held all-gathers (waiting for them under wfbp and sync), then any plan switch that
 * waited for them. */
int dear_shard_release_held(dear_ctx_t *ctx, const char *call);
/* The plan switches a backward_end may make: online re-planning, auto's check, the first plan
 * again with the first iteration's scale. */
typedef enum { DEAR_SWITCH_REPLAN, DEAR_SWITCH_VERIFY, DEAR_SWITCH_RESCALE } dear_switch_t;
/* Under DEAR_SHARD_HOLD at backward_end: a plan switch due now waits for the release; returns 1
 * if it was deferred. */
int dear_shard_defer_switch(dear_ctx_t *ctx, dear_switch_t kind);

/* compress.c */
/* A float32 gradient operation's formats (buckets.c). */
void dear_compress_args(const dear_ctx_t *ctx, dear_op_t *op);
/* The formats float32 gradients travel in, fixed at commit: the reduce-scatters' (all-reduces')
 * and the all-gathers' (calibrate.c times the collectives in them). */
void dear_compress_formats(const dear_ctx_t *ctx, dear_compress_t *rs, dear_compress_t *ag);
/* The pairs int8 refuses at commit, a pure function so that tests/mpi/test_combo.c asks the same:
 * 1 and the message (both named, what is accepted) under the deterministic mode (its blocks follow
 * the plan's shards) or with CUDA memory on an NCCL transport without ncclAlltoAll (nccl). */
int dear_compress_int8_refused(int deterministic, int nccl, char *msg, size_t len);

/* determ.c */
int dear_determ_on(const dear_ctx_t *ctx);

/* finite.c */
int dear_finite_on(const dear_ctx_t *ctx);

/* partition.c */
/* The largest unit the planners cut a tensor into (DEAR_PARTITION of rank 0). */
size_t dear_partition_bytes(const dear_ctx_t *ctx);

/* iteration.c */
/* The per-layer samples of the profile, for nlayers layers (commit), and their release. */
int dear_iter_profile_alloc(dear_iter_t *it, int nlayers);
void dear_iter_profile_free(dear_iter_t *it, int nlayers);
const dear_sched_ops_t *dear_sched_ops(dear_sched_t s);
/* The schedule's flush; the next iteration's time then starts at its first hook. */
int dear_sched_flush(dear_ctx_t *ctx, const char *call);
/* Tensor t's update callback for the gradient of `iteration`, its failure logged as
 * DEAR_ERR_CALLBACK. */
int dear_call_update(dear_ctx_t *ctx, int t, long long iteration);
/* Sharded updates: the update of this rank's slice of unit u (its averaged gradient in place). */
int dear_call_update_slice(dear_ctx_t *ctx, int u, long long iteration);
/* A plan switch of a backward_end, its collectives drained first. */
int dear_switch_plan(dear_ctx_t *ctx, dear_switch_t kind);
/* The per-layer profile of the iterations so far as the slowest rank ran them (each layer's
 * median forward and backward times, the maximum over the ranks: a plan must fit the slowest
 * worker) with the registered tensors, checked. communicated: as planning prices it (the bytes
 * that travel, and each layer's update callbacks added to its forward time); else the model's.
 * Collective; rank 0 gets it in *prof (init'ed empty on the others; free it everywhere).
 * DEAR_ERR_MPI or DEAR_ERR_NOMEM on every rank alike; rank 0 alone may also return the
 * profile's own errors (logged). */
int dear_profile_measured(dear_ctx_t *ctx, const char *model, int communicated, dear_profile_t *prof);
/* The registered model without times (a model description: layers with their hints, tensors as
 * planning prices them, sparse ones dense but cut at their blocks); what planning without a
 * profile starts from (fusion/estimate.h). Any rank; not collective. */
int dear_profile_structure(const dear_ctx_t *ctx, dear_profile_t *prof);
/* Collective: the first training iteration's forward and backward compute, summed over the
 * layers, the slowest rank's (rank 0 gets them; others' are unset). */
int dear_first_iteration_times(dear_ctx_t *ctx, double *fwd_s, double *bwd_s);

#endif

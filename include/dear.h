/*
 * dear.h: the whole public API of libdear.
 *
 * libdear makes gradient synchronisation of MPI data-parallel training nearly free. Every
 * all-reduce is split into a reduce-scatter, launched during back-propagation as soon as a
 * bucket of gradients is complete, and an all-gather that runs during the next forward pass,
 * just ahead of the layer that needs it (DeAR). A progress thread owned by the library makes
 * every MPI call on a private duplicate of the communicator; the application thread only ever
 * blocks for data it needs.
 *
 * One iteration, for every schedule (DEAR_SCHEDULE=dear|wfbp|sync):
 *
 *     for l in layers (forward order):  dear_forward_begin(ctx, l); forward(l);
 *     for l in layers (reverse order):  backward(l) -> writes grads; dear_backward_done(ctx, l);
 *     dear_backward_end(ctx);
 *
 * The update callback of each tensor runs exactly once per iteration, on the application
 * thread, the moment that tensor's averaged gradient is in place: inside dear_forward_begin of
 * its layer for `dear`, inside dear_backward_end for `wfbp` and `sync`. Call dear_flush before
 * evaluation, checkpointing and exit: it completes all communication and runs every pending
 * update, so no step is ever silently deferred.
 *
 * All functions return DEAR_OK (0) or a negative dear_status_t; the first place inside the
 * library that sees an error logs it with context, so callers need only check the code.
 * Functions taking a context are not thread-safe with respect to each other: call them from one
 * application thread.
 */
#ifndef DEAR_H
#define DEAR_H

#include <stddef.h>
#include <stdint.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DEAR_API __attribute__((visibility("default")))
#else
#define DEAR_API
#endif

#define DEAR_VERSION_MAJOR 0
#define DEAR_VERSION_MINOR 1
#define DEAR_VERSION_PATCH 0

/* Status codes: DEAR_OK or negative. MPI, CUDA and NCCL codes are translated where they enter
 * the library and are never returned raw. */
typedef enum {
    DEAR_OK = 0,
    DEAR_ERR_ARG = -1,          /* invalid argument (NULL pointer, unknown enum, bad count) */
    DEAR_ERR_STATE = -2,        /* call out of order (register after commit, done twice, ...) */
    DEAR_ERR_MISMATCH = -3,     /* ranks disagree (registered tensors, plan) */
    DEAR_ERR_MPI = -4,          /* an MPI call failed */
    DEAR_ERR_NOMEM = -5,        /* allocation failed */
    DEAR_ERR_UNSUPPORTED = -6,  /* feature not built or not available here */
    DEAR_ERR_TIMEOUT = -7,      /* an operation stalled past DEAR_STALL_ABORT_S */
    DEAR_ERR_PARAM = -8,        /* a DEAR_* environment variable has a bad value */
    DEAR_ERR_IO = -9,           /* a file could not be read or written */
    DEAR_ERR_FORMAT = -10,      /* a file (plan, profile, calibration) is malformed */
    DEAR_ERR_CALLBACK = -11,    /* an update callback returned non-zero */
    DEAR_ERR_CUDA = -12,        /* a CUDA or NCCL call failed */
    DEAR_ERR_INTERNAL = -13     /* a bug in libdear: please report it */
} dear_status_t;

/* Element types. 16-bit floating types are reduced in float32 and rounded once. */
typedef enum {
    DEAR_FLOAT32 = 0,
    DEAR_FLOAT64 = 1,
    DEAR_BFLOAT16 = 2,
    DEAR_FLOAT16 = 3,
    DEAR_INT32 = 4
} dear_dtype_t;
#define DEAR_DTYPE_COUNT 5

/* Where a registered buffer lives. */
typedef enum {
    DEAR_MEM_HOST = 0,
    DEAR_MEM_CUDA = 1           /* refused with DEAR_ERR_UNSUPPORTED until the CUDA backend lands */
} dear_mem_t;

typedef struct dear_ctx dear_ctx_t;

/* Update callback: grad holds the gradient averaged over all ranks (count elements of dtype).
 * Runs on the application thread, exactly once per tensor per iteration. Return 0 on success;
 * non-zero makes the calling dear_* function return DEAR_ERR_CALLBACK. */
typedef int (*dear_update_fn)(void *grad, size_t count, dear_dtype_t dtype, void *arg);

/* Counters for progress reports; all times in seconds, since dear_commit. */
typedef struct {
    uint64_t iterations;        /* completed dear_backward_end calls */
    double blocked_s;           /* application time blocked in forward_begin/backward_end/flush */
    double last_iter_s;         /* wall time of the last complete iteration */
    double median_iter_s;       /* median iteration time so far (0 before the second) */
    uint64_t bytes_sent;        /* payload bytes this rank sent in collectives */
    double progress_cpu_s;      /* CPU time used by the progress thread */
} dear_stats_t;

/* Create a context on comm (duplicated internally). MPI must be initialised with
 * MPI_THREAD_MULTIPLE; anything less fails with DEAR_ERR_UNSUPPORTED and says so. Reads the
 * DEAR_* environment once: a bad value fails with DEAR_ERR_PARAM naming it. Collective. */
DEAR_API int dear_init(MPI_Comm comm, dear_ctx_t **ctx);

/* Register one gradient tensor, in forward order. layer: the caller's layer id; ids must be
 * non-decreasing in registration order and a layer may hold several tensors. grad must stay
 * valid until dear_finalize; tensors that lie back to back in memory (one gradient arena) are
 * communicated without copies. name: up to 63 characters, unique. count must be > 0; dtype
 * a floating type (DEAR_INT32 is refused: it cannot be averaged); update may be NULL (the
 * averaged gradient is then only left in grad). Errors: DEAR_ERR_ARG, DEAR_ERR_UNSUPPORTED
 * (DEAR_MEM_CUDA), DEAR_ERR_STATE (after dear_commit). */
DEAR_API int dear_register(dear_ctx_t *ctx, const char *name, int layer, void *grad, size_t count,
                           dear_dtype_t dtype, dear_mem_t mem, dear_update_fn update, void *arg);

/* Freeze the registry and build the communication plan. Collective: every rank must have
 * registered the same tensors (name, layer, count, type, order); otherwise every rank fails
 * within seconds with DEAR_ERR_MISMATCH and a message naming the first difference.
 * With a model-driven planner (DEAR_FUSION=mgwfbp|dp|gradssa|auto, auto being the default) on
 * two or more ranks, commit also gets the cost model: DEAR_CALIBRATE=auto measures the
 * collectives on the communicator (about 0.2 s on 4 ranks of one host) unless
 * DEAR_CALIBRATION_FILE already holds it; DEAR_CALIBRATE=off takes DEAR_COST_PRESET. Training
 * then starts on the threshold plan; see dear_backward_end for the switch. DEAR_PLAN_FILE,
 * DEAR_FUSION=none|threshold and DEAR_SCHEDULE=sync keep one fixed plan. */
DEAR_API int dear_commit(dear_ctx_t *ctx);

/* Before computing the forward pass of layer: waits until the layer's averaged gradients from
 * the previous iteration are in place and runs their updates (schedule `dear`). Call it for
 * every layer before the backward pass writes that layer's gradients; a repeated call (an
 * evaluation forward) has nothing left to do. An unknown layer id is DEAR_ERR_ARG; a call
 * between the first dear_backward_done and dear_backward_end is DEAR_ERR_STATE. */
DEAR_API int dear_forward_begin(dear_ctx_t *ctx, int layer);

/* After the gradients of layer are written: buckets that became complete are queued. A second
 * call for a layer in the same backward pass is DEAR_ERR_STATE. */
DEAR_API int dear_backward_done(dear_ctx_t *ctx, int layer);

/* After the whole backward pass: queues the all-gathers (dear) or waits for the all-reduces
 * and runs the updates (wfbp, sync). DEAR_ERR_STATE unless every layer reported backward_done.
 * Online planning happens here: at the backward_end of iteration DEAR_WARMUP_ITERS (and every
 * DEAR_REPLAN_EVERY iterations after it) every rank waits for the collectives in flight (dear:
 * this iteration's all-gathers, so this one call blocks for them; the updates still run in the
 * next dear_forward_begin), rank 0 plans from the measured per-layer times and broadcasts, and
 * all ranks continue on the new plan. With DEAR_FUSION=auto the new plan is then timed for
 * DEAR_VERIFY_ITERS iterations and, at another such backward_end, dropped for the plan it
 * replaced if that one ran faster. Results are unchanged by a switch (same sums, same updates);
 * DEAR_LOG_LEVEL=info logs the plan, its predicted and its measured iteration time. */
DEAR_API int dear_backward_end(dear_ctx_t *ctx);

/* Complete all communication in flight and run every pending update. Between iterations only
 * (during a backward pass it is DEAR_ERR_STATE); a no-op when nothing is pending. */
DEAR_API int dear_flush(dear_ctx_t *ctx);

/* Snapshot of the counters. */
DEAR_API int dear_get_stats(dear_ctx_t *ctx, dear_stats_t *stats);

/* Write the per-layer profile measured so far (forward/backward times, tensor sizes) in the
 * text format of docs/FORMATS.md, which dear-plan reads. Rank 0 writes; collective. */
DEAR_API int dear_profile_save(dear_ctx_t *ctx, const char *path);

/* Write the plan in use (buckets, all-gather groups, early groups, who made it) as a plan file
 * (docs/FORMATS.md) that DEAR_PLAN_FILE and dear-plan read: after online planning it is the
 * plan the runtime settled on. Every rank holds the same plan; call it on one. Not collective.
 * DEAR_ERR_STATE before dear_commit, DEAR_ERR_IO if the file cannot be written. */
DEAR_API int dear_plan_save(dear_ctx_t *ctx, const char *path);

/* Flush, stop the progress thread, free everything. ctx may be NULL. Collective. */
DEAR_API int dear_finalize(dear_ctx_t *ctx);

/* Short English text for a status code; never NULL. */
DEAR_API const char *dear_status_string(int status);

/* "MAJOR.MINOR.PATCH". */
DEAR_API const char *dear_version(void);

#ifdef __cplusplus
}
#endif

#endif /* DEAR_H */

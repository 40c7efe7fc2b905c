/*
 * dear_types.h: the MPI-free part of libdear's public API: status codes, element types, memory
 * kinds, the update callback, the counters and the status text. include/dear.h includes it; the
 * library's MPI-free layers (base/, fusion/) include only this, so they never see mpi.h.
 */
#ifndef DEAR_TYPES_H
#define DEAR_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DEAR_API __attribute__((visibility("default")))
#else
#define DEAR_API
#endif

#define DEAR_VERSION_MAJOR 0
#define DEAR_VERSION_MINOR 2
#define DEAR_VERSION_PATCH 0

/* Status codes: DEAR_OK or negative. MPI, CUDA and NCCL codes are translated where they enter
 * the library and are never returned raw. One list gives the enum and the text of each code
 * (dear_status_string), as libuv's UV_ERRNO_MAP does: X(NAME, CODE, "text"). */
#define DEAR_STATUS_MAP(X)                                                                      \
    X(OK, 0, "success")                                                                         \
    /* NULL pointer, unknown enum, bad count, ... */                                            \
    X(ERR_ARG, -1, "invalid argument")                                                          \
    /* register after commit, done twice, ... */                                                \
    X(ERR_STATE, -2, "call out of order")                                                       \
    /* ranks disagree (registered tensors, layers), or a plan file was made for other tensors */ \
    X(ERR_MISMATCH, -3,                                                                         \
      "mismatch: ranks registered differently, or a plan file does not fit the tensors")        \
    X(ERR_MPI, -4, "MPI error")                                                                 \
    X(ERR_NOMEM, -5, "out of memory")                                                           \
    /* a feature not built, or not available here */                                            \
    X(ERR_UNSUPPORTED, -6, "not supported in this build or setting")                            \
    /* a bounded wait ran out: a transport's set-up past its timeout */                         \
    X(ERR_TIMEOUT, -7, "timed out: a bounded wait ran out")                                     \
    /* a DEAR_* environment variable has a bad value */                                         \
    X(ERR_PARAM, -8, "bad DEAR_* parameter value")                                              \
    /* a file (plan, profile, calibration) could not be read or written */                      \
    X(ERR_IO, -9, "I/O error")                                                                  \
    X(ERR_FORMAT, -10, "malformed file")                                                        \
    /* an update callback returned non-zero */                                                  \
    X(ERR_CALLBACK, -11, "update callback failed")                                              \
    X(ERR_CUDA, -12, "CUDA or NCCL error")                                                      \
    /* a bug in libdear: please report it */                                                    \
    X(ERR_INTERNAL, -13, "internal error")                                                      \
    /* the socket transport failed: a connection could not be made or authenticated, or a peer  \
     * closed, reset or stopped acknowledging it, or sent more than the limits allow */         \
    X(ERR_NET, -14,                                                                             \
      "socket transport error (connection failed, refused, closed, reset or dead, or a peer broke its limits)") \
    /* a transport's set-up met a process that proved the job's key for a rank already proven: */ \
    /* an impostor holds the key, or a rank runs twice; auto does not fall back on it */          \
    X(ERR_AUTH, -15, "authentication failed: a rank proved itself twice (an impostor holds the job's key?)")

typedef enum {
#define DEAR_STATUS_ENUM_(NAME, CODE, TEXT) DEAR_##NAME = CODE,
    DEAR_STATUS_MAP(DEAR_STATUS_ENUM_)
#undef DEAR_STATUS_ENUM_
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

/* Wire formats of float32 gradients (dear_set_compress, DEAR_COMPRESS): the type they travel
 * in. Every sum is still taken in float32; values are rounded only to cross the wire, and the
 * averaged gradient arrives as float32. Other types travel as they are. */
typedef enum {
    DEAR_COMPRESS_NONE = 0,     /* float32 on the wire */
    DEAR_COMPRESS_BF16 = 1,     /* bfloat16: float32's range, 8 bits of mantissa */
    DEAR_COMPRESS_FP16 = 2,     /* IEEE binary16: 11 bits of mantissa, magnitudes up to 65504 */
    DEAR_COMPRESS_INT8 = 3      /* 8-bit integers, one float32 scale (max|x| / 127) per block of
                                 * DEAR_COMPRESS_INT8_BLOCK elements: each value within half a
                                 * scale of its input; quantized once per phase (direct shape) */
} dear_compress_t;
#define DEAR_COMPRESS_COUNT 4
/* Elements per int8 block: the scale's float32 adds 4 bytes to every 256 codes. */
#define DEAR_COMPRESS_INT8_BLOCK 256

/* Where a registered buffer lives. */
typedef enum {
    DEAR_MEM_HOST = 0,
    DEAR_MEM_CUDA = 1           /* device memory of the current CUDA device (dear_set_stream); refused
                                 * with DEAR_ERR_UNSUPPORTED by a libdear built without CUDA */
} dear_mem_t;

typedef struct dear_ctx dear_ctx_t;

/* What the next passes are (dear_set_mode). */
typedef enum {
    DEAR_MODE_TRAIN = 0,        /* the default: every backward pass is synchronised */
    DEAR_MODE_ACCUMULATE = 1,   /* micro-batches: backward passes stay local (like DDP's no_sync);
                                 * the gradients are added to by the application and synchronised
                                 * by the first backward pass after the mode is TRAIN again */
    DEAR_MODE_EVAL = 2          /* forward passes only: every update has run, nothing is measured */
} dear_mode_t;

/* What an update callback is told about the averaged gradient it is called for. Fields are only
 * ever added at the end: `size` is sizeof(dear_update_info_t) of the library that filled it, so a
 * program built against a newer dear.h can test whether a field is there. */
typedef struct dear_update_info {
    size_t size;
    void *grad;                 /* the gradient averaged over all ranks (and clipped: clip_coef) */
    size_t count;               /* elements of dtype */
    dear_dtype_t dtype;
    dear_mem_t mem;
    void *arg;                  /* the registration's arg */
    const char *name;           /* the registration's name */
    int tensor;                 /* index in registration order, from 0 */
    int layer;                  /* the registration's layer id */
    long long iteration;        /* the iteration the gradient belongs to: 0 for the first backward
                                 * pass (under `dear` the update runs in the next iteration's
                                 * forward, so read this, not your own counter, for an LR schedule) */
    double grad_norm;           /* L2 norm of the whole averaged gradient (every tensor) before
                                 * clipping, when clipping is on (dear_set_clip_norm,
                                 * DEAR_CLIP_NORM); -1 when it is off */
    double clip_coef;           /* what grad was multiplied by: min(1, max_norm / (grad_norm + 1e-6)),
                                 * 1 when clipping is off */
    void *stream;               /* DEAR_MEM_CUDA: the cudaStream_t to launch the update on (the one
                                 * dear_set_stream named), already ordered after the averaged
                                 * gradient; NULL there means the legacy default stream. Host
                                 * memory: NULL */
    /* Sharded updates (read them where size covers them): */
    void *param;                /* the parameters grad is for, elements [offset, offset + count) of the
                                 * buffer dear_set_param gave; NULL when none was given */
    size_t offset;              /* elements of the tensor before grad and param: 0 for a whole tensor;
                                 * under sharded updates (dear_set_shard) the slice's first element */
    size_t tensor_count;        /* elements of the whole tensor; count < tensor_count: a slice */
    size_t shard_offset;        /* sharded updates: where the slice starts in this rank's shard, its
                                 * slices of every tensor back to back in dear_shard_slices order (one
                                 * array of optimizer state serves them all); 0 otherwise */
} dear_update_info_t;

/* Sharded updates (dear_set_shard, DEAR_SHARD): flags. */
#define DEAR_SHARD_ON 1         /* each rank updates only its shard; the all-gathers carry parameters */
#define DEAR_SHARD_HOLD 2       /* the parameters are sent at dear_shard_release (or the next hook),
                                 * not when the update callbacks return: the program steps its
                                 * slices itself after dear_backward_end */

/* One slice of a tensor that a rank updates under sharded updates (dear_shard_slices). */
typedef struct {
    int tensor;                 /* registration index */
    size_t offset;              /* first element of the slice in the tensor */
    size_t count;               /* elements */
    size_t shard_offset;        /* its first element in the rank's shard: the slices back to back */
} dear_slice_t;

/* Update callback: runs on the application thread exactly once per tensor per iteration, the
 * moment its averaged gradient is in place (dear_register says when). Return 0 on success;
 * non-zero makes the calling dear_* function return DEAR_ERR_CALLBACK. */
typedef int (*dear_update_fn)(const dear_update_info_t *info);

/* Counters for progress reports; all times in seconds, since dear_commit. */
typedef struct {
    uint64_t iterations;        /* completed dear_backward_end calls */
    double blocked_s;           /* application time blocked in forward_begin/backward_end/flush */
    double last_iter_s;         /* wall time of the last complete iteration */
    double median_iter_s;       /* median iteration time so far (0 before the second) */
    uint64_t bytes_sent;        /* payload bytes this rank sent in collectives */
    double progress_cpu_s;      /* CPU time used by the progress thread */
} dear_stats_t;

/* What the sparse path did for one tensor declared sparse (dear_get_sparse_stats). Fields are
 * only ever added at the end: the caller sets `size` to sizeof(dear_sparse_stats_t) and the
 * library fills what fits, so a program built against an older dear.h keeps working. */
typedef struct {
    size_t size;                /* set by the caller */
    size_t block;               /* elements per block (dear_register_sparse); 0: not sparse */
    int sparse_rs;              /* its reduce-scatters (all-reduces under wfbp, sync, unsharded) run
                                 * sparse now (a bucket runs sparse when every tensor in it pays) */
    int sparse_ag;              /* its all-gathers run sparse now (schedule dear, unsharded: sharded,
                                 * they carry parameters and run dense) */
    double density;             /* fraction of its blocks that were non-zero in this rank's gradient
                                 * over the warm-up iterations (DEAR_WARMUP_ITERS); -1: not measured */
    double density_union;       /* the same fraction of the averaged gradient, the union over ranks
                                 * (-1 sharded, where no rank holds the whole averaged gradient) */
    uint64_t bytes_sent;        /* payload this rank sent in its bucket's sparse collectives (shared
                                 * with the other tensors of its bucket) */
    uint64_t msgs_sparse;       /* of their messages, those sent as non-zero blocks with indices */
    uint64_t msgs_dense;        /* and those sent whole (the sparse form was no smaller) */
} dear_sparse_stats_t;

/* How online planning priced the plans it chose between (dear_get_plan_info). Fields are only
 * ever added at the end: the caller sets `size` to sizeof(dear_plan_info_t) and the library fills
 * what fits. */
typedef struct {
    size_t size;                /* set by the caller */
    double comm_scale;          /* the factor by which every collective's calibrated price must grow
                                 * for the model to price the plan in force at the last online plan
                                 * as it ran (DEAR_COST_REFIT; the planners use it under "plan"); 1:
                                 * none */
    double measured_iter_s;     /* the plan in force then: its measured iteration (each rank's median,
                                 * the mean over the ranks); 0 before the first online plan */
    double predicted_iter_s;    /* the same plan's iteration as the calibrated model priced it */
} dear_plan_info_t;

/* Short English text for a status code; never NULL. */
DEAR_API const char *dear_status_string(int status);

/* The error lines libdear logged since the previous call (any thread, whatever DEAR_LOG_LEVEL),
 * copied into buf (at most len - 1 characters, NUL-terminated), then forgotten; returns their
 * full length. For bindings that turn a failed call into an exception with the library's words. */
DEAR_API size_t dear_last_error(char *buf, size_t len);

/* "MAJOR.MINOR.PATCH". */
DEAR_API const char *dear_version(void);

#ifdef __cplusplus
}
#endif

#endif /* DEAR_TYPES_H */

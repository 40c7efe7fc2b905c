/*
 * Gradient data is reached through a memory-ops table, one row per kind of memory: every copy,
 * zero, scale, 16-bit conversion, sum and squared norm that the runtime and the collectives do
 * on it goes through the row of the memory it lies in, so a kind of memory plugs in as one file
 * and one row (docs/HACKING.md).
 *
 * The table is asynchronous, for a device that runs work in order on queues (CUDA streams):
 * each operation is enqueued on a queue and runs after the work enqueued before it there; a
 * fence is a snapshot of a queue (record), which another queue can be made to wait for (wait)
 * or the host can ask about (query, or wait with queue NULL). Queue NULL is the calling thread:
 * the operation has run when the call returns, and a fence recorded on it is complete at once.
 * The host row (mem_host.c) runs everything at once on the caller's thread; the collectives,
 * which run on host memory, always pass queue NULL.
 *
 * Who may touch what: memory of a row without DEAR_MEM_F_HOST_ACCESS is never read or written
 * by the host; memory of a row with it only between the fences that order the queues that
 * write it against the host.
 */
#ifndef DEAR_MEM_H
#define DEAR_MEM_H

#include <stddef.h>

#include "include/dear_types.h"

typedef struct dear_memq dear_memq_t;
typedef struct dear_fence dear_fence_t;

/* The host may read and write the memory on its own thread (after the fences). */
#define DEAR_MEM_F_HOST_ACCESS 0x1
/* The collectives run on host copies of this memory (a buffer per bucket, alloc with host set),
 * filled and emptied by the row's copies on the communication queue. */
#define DEAR_MEM_F_STAGE 0x2

/* Every entry returns DEAR_OK or an error (logged by the row). Counts are elements of t. */
typedef struct dear_mem_ops {
    const char *name;
    unsigned flags;
    /* A buffer of bytes (bytes > 0): host memory suited to this row's copies when host is set
     * (pinned, for a device), else memory of this row. *p set on success; release takes it back. */
    int (*alloc)(size_t bytes, int host, void **p);
    void (*release)(void *p, int host);
    /* A queue of this row (NULL, and DEAR_OK, for a row whose work always runs at once). */
    int (*queue_create)(dear_memq_t **q);
    void (*queue_destroy)(dear_memq_t *q);
    /* Optional: the calling thread will enqueue on q (a device row selects q's device for it). */
    int (*bind)(dear_memq_t *q);
    int (*fence_create)(dear_fence_t **f);
    void (*fence_destroy)(dear_fence_t *f);
    /* f captures q's work so far (q NULL: nothing pending, f complete). */
    int (*fence_record)(dear_fence_t *f, dear_memq_t *q);
    /* q's later work waits for f; q NULL: the calling thread waits. A fence never recorded is
     * complete. */
    int (*fence_wait)(dear_memq_t *q, dear_fence_t *f);
    /* *done = 1 once the work f captured has run. */
    int (*fence_query)(dear_fence_t *f, int *done);
    /* dst = src, bytes; the ranges do not overlap. Either side may be host memory where the row
     * allows it (a device row copies between host and device). */
    int (*copy)(dear_memq_t *q, void *dst, const void *src, size_t bytes);
    int (*zero)(dear_memq_t *q, void *dst, size_t bytes);
    /* dst = src * s (dst may be src). */
    int (*scale)(dear_memq_t *q, dear_dtype_t t, void *dst, const void *src, size_t n, double s);
    /* dst = (a + b) * s; dst may be a or b. 16-bit types are added in float32, rounded once. */
    int (*sum)(dear_memq_t *q, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n, double s);
    /* float32 partial sums of 16-bit data: dst = float32(src); acc += float32(src); dst =
     * round(src * s) to t. For float32 they copy, add and scale. */
    int (*widen)(dear_memq_t *q, dear_dtype_t t, float *dst, const void *src, size_t n);
    int (*widen_acc)(dear_memq_t *q, dear_dtype_t t, float *acc, const void *src, size_t n);
    int (*narrow)(dear_memq_t *q, dear_dtype_t t, void *dst, const float *src, size_t n, double s);
    /* *out (host memory) = the sum of the squares of src in float64, in index order, written by
     * the time a fence recorded on q after it is complete. */
    int (*sumsq)(dear_memq_t *q, dear_dtype_t t, const void *src, size_t n, double *out);
    /* Optional (NULL: the collectives compose it of widen, sum and narrow). A compressed hop, t a
     * 16-bit type: dst = round((a + float32(b)) * s) to t, or with dst32 set dst32 = (a + float32(b))
     * * s instead; dst32 may be a. */
    int (*wire_add)(dear_memq_t *q, dear_dtype_t t, void *dst, float *dst32, const float *a, const void *b, size_t n,
                    double s);
    /* Optional (NULL: the row has none). Error feedback of float32 v against the 16-bit type t:
     * x = v + e; v = round(x) to t, as float32; e = x - v (0 where v is not finite). */
    int (*feedback)(dear_memq_t *q, dear_dtype_t t, float *v, float *e, size_t n);
} dear_mem_ops_t;

/* Host memory, everything at once on the calling thread (collectives/reduce.c's kernels). */
extern const dear_mem_ops_t dear_mem_host_ops;

/* 1 once f is complete (a NULL fence is). */
int dear_fence_done(const dear_mem_ops_t *ops, dear_fence_t *f, int *done);

#endif

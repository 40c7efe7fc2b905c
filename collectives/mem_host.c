/*
 * The host row of the memory table (mem.h): host memory, every operation done on the calling
 * thread when it is called (reduce.c's kernels), so its queues are NULL and its fences complete
 * at once.
 */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "collectives/mem.h"
#include "collectives/reduce.h"

static int host_alloc(size_t bytes, int host, void **p)
{
    void *m = malloc(bytes);
    if (m == NULL) {
        DEAR_ERROR("sys", "allocation of %zu bytes of host memory failed", bytes);
        return DEAR_ERR_NOMEM;
    }
    *p = m;
    return DEAR_OK;
}

static void host_release(void *p, int host) { free(p); }

static int host_queue_create(dear_memq_t **q)
{
    *q = NULL;
    return DEAR_OK;
}

static void host_queue_destroy(dear_memq_t *q) { (void)q; }

/* Fences of a row that never queues anything: a NULL fence, always complete. */
static int host_fence_create(dear_fence_t **f)
{
    *f = NULL;
    return DEAR_OK;
}

static void host_fence_destroy(dear_fence_t *f) { (void)f; }
static int host_fence_record(dear_fence_t *f, dear_memq_t *q) { return DEAR_OK; }
static int host_fence_wait(dear_memq_t *q, dear_fence_t *f) { return DEAR_OK; }

static int host_fence_query(dear_fence_t *f, int *done)
{
    *done = 1;
    return DEAR_OK;
}

static int host_copy(dear_memq_t *q, void *dst, const void *src, size_t bytes)
{
    if (bytes > 0)
        memcpy(dst, src, bytes);
    return DEAR_OK;
}

static int host_zero(dear_memq_t *q, void *dst, size_t bytes)
{
    if (bytes > 0)
        memset(dst, 0, bytes);
    return DEAR_OK;
}

static int host_scale(dear_memq_t *q, dear_dtype_t t, void *dst, const void *src, size_t n, double s)
{
    dear_reduce_scale(t, dst, src, n, s);
    return DEAR_OK;
}

static int host_sum(dear_memq_t *q, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n, double s)
{
    dear_reduce_sum(t, dst, a, b, n, s);
    return DEAR_OK;
}

static int host_widen(dear_memq_t *q, dear_dtype_t t, float *dst, const void *src, size_t n)
{
    dear_reduce_widen(t, dst, src, n);
    return DEAR_OK;
}

static int host_widen_acc(dear_memq_t *q, dear_dtype_t t, float *acc, const void *src, size_t n)
{
    dear_reduce_widen_acc(t, acc, src, n);
    return DEAR_OK;
}

static int host_narrow(dear_memq_t *q, dear_dtype_t t, void *dst, const float *src, size_t n, double s)
{
    dear_reduce_narrow(t, dst, src, n, s);
    return DEAR_OK;
}

static int host_sumsq(dear_memq_t *q, dear_dtype_t t, const void *src, size_t n, double *out)
{
    *out = dear_reduce_sumsq(t, src, n);
    return DEAR_OK;
}

static int host_wire_add(dear_memq_t *q, dear_dtype_t t, void *dst, float *dst32, const float *a, const void *b,
                         size_t n, double s)
{
    (void)q;
    dear_reduce_wire_add(t, dst, dst32, a, b, n, s);
    return DEAR_OK;
}

static int host_feedback(dear_memq_t *q, dear_dtype_t t, float *v, float *e, size_t n)
{
    (void)q;
    dear_reduce_feedback(t, v, e, n);
    return DEAR_OK;
}

const dear_mem_ops_t dear_mem_host_ops = {
    .name = "host",
    .flags = DEAR_MEM_F_HOST_ACCESS,
    .alloc = host_alloc,
    .release = host_release,
    .queue_create = host_queue_create,
    .queue_destroy = host_queue_destroy,
    .fence_create = host_fence_create,
    .fence_destroy = host_fence_destroy,
    .fence_record = host_fence_record,
    .fence_wait = host_fence_wait,
    .fence_query = host_fence_query,
    .copy = host_copy,
    .zero = host_zero,
    .scale = host_scale,
    .sum = host_sum,
    .widen = host_widen,
    .widen_acc = host_widen_acc,
    .narrow = host_narrow,
    .sumsq = host_sumsq,
    .wire_add = host_wire_add,
    .feedback = host_feedback,
};

int dear_fence_done(const dear_mem_ops_t *ops, dear_fence_t *f, int *done)
{
    if (f == NULL) {
        *done = 1;
        return DEAR_OK;
    }
    return ops->fence_query(f, done);
}

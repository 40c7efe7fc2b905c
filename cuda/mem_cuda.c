/*
 * The CUDA rows of the memory table (collectives/mem.h): device memory, a queue being a CUDA
 * stream and a fence a CUDA event. Every operation is enqueued on its stream and returns at
 * once; queue NULL is the calling thread (the legacy stream, then a wait). Fences are recorded
 * with cudaEventRecord and waited for with cudaStreamWaitEvent, never with a stream waiting on
 * itself, which orders nothing. A fence never recorded (or recorded on queue NULL) is complete
 * and is never handed to CUDA, which would wait on it silently for nothing.
 *
 * Two rows share these functions: the direct row, whose collectives the NCCL transport runs on
 * device memory, and the staged row (DEAR_MEM_F_STAGE), whose buckets have pinned host copies
 * for dear's own collectives on the host.
 */
#include <stdlib.h>

#include "base/check.h"
#include "base/util.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_impl.h"
#include "cuda/kern.h"

struct dear_memq {
    cudaStream_t s;
    int owned;                  /* created here (destroyed with the queue), or the application's */
    int dev;
    double *scratch;            /* sumsq's partial sums: DEAR_KERN_SUMSQ_BLOCKS + 1 doubles */
};

struct dear_fence {
    cudaEvent_t ev;
    int recorded;               /* 0: complete (never recorded, or recorded on queue NULL) */
};

static cudaStream_t stream_of(const dear_memq_t *q) { return q ? q->s : cudaStreamLegacy; }

cudaStream_t dear_cuda_queue_stream(const dear_memq_t *q) { return stream_of(q); }

/* Queue NULL: the work just enqueued on the legacy stream has run when the call returns. */
static int finish_sync(const dear_memq_t *q)
{
    if (q == NULL)
        DEAR_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    return DEAR_OK;
}

static int kern_done(const dear_memq_t *q, cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        DEAR_ERROR("cuda", "the %s kernel could not be launched: %s", what, cudaGetErrorString(err));
        return DEAR_ERR_CUDA;
    }
    return finish_sync(q);
}

static int c_alloc(size_t bytes, int host, void **p)
{
    if (host)
        return dear_cuda_pinned_alloc(bytes, p);
    cudaError_t err = cudaMalloc(p, bytes);
    if (err != cudaSuccess) {
        DEAR_ERROR("cuda", "cudaMalloc of %zu bytes of device memory failed: %s", bytes, cudaGetErrorString(err));
        return err == cudaErrorMemoryAllocation ? DEAR_ERR_NOMEM : DEAR_ERR_CUDA;
    }
    return DEAR_OK;
}

static void c_release(void *p, int host)
{
    if (p == NULL)
        return;
    if (host)
        dear_cuda_pinned_free(p);
    else
        cudaFree(p);
}

static int queue_scratch(dear_memq_t *q)
{
    if (q->scratch == NULL)
        DEAR_CUDA_CHECK(cudaMalloc((void **)&q->scratch, (DEAR_KERN_SUMSQ_BLOCKS + 1) * sizeof(double)));
    return DEAR_OK;
}

static int c_queue_create(dear_memq_t **out)
{
    int rc = DEAR_OK, lo = 0, hi = 0;
    dear_memq_t *q = calloc(1, sizeof *q);
    if (q == NULL)
        return DEAR_ERR_NOMEM;
    q->owned = 1;
    DEAR_CUDA_CHECK_GOTO(cudaGetDevice(&q->dev), rc, err);
    /* Communication first: its stream gets the highest priority, as NCCL's users give theirs. */
    DEAR_CUDA_CHECK_GOTO(cudaDeviceGetStreamPriorityRange(&lo, &hi), rc, err);
    DEAR_CUDA_CHECK_GOTO(cudaStreamCreateWithPriority(&q->s, cudaStreamNonBlocking, hi), rc, err);
    *out = q;
    return DEAR_OK;
err:
    free(q);
    return rc;
}

int dear_cuda_queue_wrap(void *stream, dear_memq_t **out)
{
    dear_memq_t *q = calloc(1, sizeof *q);
    if (q == NULL)
        return DEAR_ERR_NOMEM;
    q->s = (cudaStream_t)stream;
    int rc = DEAR_OK;
    DEAR_CUDA_CHECK_GOTO(cudaGetDevice(&q->dev), rc, err);
    *out = q;
    return DEAR_OK;
err:
    free(q);
    return rc;
}

static void c_queue_destroy(dear_memq_t *q)
{
    if (q == NULL)
        return;
    int dev = q->dev;
    cudaGetDevice(&dev);
    cudaSetDevice(q->dev);
    if (q->owned) { /* nothing queued may outlive the buffers it uses; the application's stream is its own */
        cudaStreamSynchronize(q->s);
        cudaStreamDestroy(q->s);
    }
    cudaFree(q->scratch);
    cudaSetDevice(dev);
    free(q);
}

void dear_cuda_queue_free(dear_memq_t *q) { c_queue_destroy(q); }

static int c_bind(dear_memq_t *q)
{
    if (q)
        DEAR_CUDA_CHECK(cudaSetDevice(q->dev));
    return DEAR_OK;
}

static int c_fence_create(dear_fence_t **out)
{
    dear_fence_t *f = calloc(1, sizeof *f);
    if (f == NULL)
        return DEAR_ERR_NOMEM;
    if (cudaEventCreateWithFlags(&f->ev, cudaEventDisableTiming) != cudaSuccess) {
        DEAR_ERROR("cuda", "cudaEventCreateWithFlags failed: %s", cudaGetErrorString(cudaGetLastError()));
        free(f);
        return DEAR_ERR_CUDA;
    }
    *out = f;
    return DEAR_OK;
}

static void c_fence_destroy(dear_fence_t *f)
{
    if (f == NULL)
        return;
    cudaEventDestroy(f->ev);
    free(f);
}

static int c_fence_record(dear_fence_t *f, dear_memq_t *q)
{
    f->recorded = q != NULL;
    if (q)
        DEAR_CUDA_CHECK(cudaEventRecord(f->ev, q->s));
    return DEAR_OK;
}

static int c_fence_wait(dear_memq_t *q, dear_fence_t *f)
{
    if (f == NULL || !f->recorded)
        return DEAR_OK;
    if (q == NULL)
        DEAR_CUDA_CHECK(cudaEventSynchronize(f->ev));
    else
        DEAR_CUDA_CHECK(cudaStreamWaitEvent(q->s, f->ev, 0));
    return DEAR_OK;
}

static int c_fence_query(dear_fence_t *f, int *done)
{
    *done = 1;
    if (f == NULL || !f->recorded)
        return DEAR_OK;
    cudaError_t err = cudaEventQuery(f->ev);
    if (err == cudaErrorNotReady) {
        *done = 0;
        return DEAR_OK;
    }
    DEAR_CUDA_CHECK(err);
    return DEAR_OK;
}

static int c_copy(dear_memq_t *q, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DEAR_OK;
    DEAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_of(q)));
    return finish_sync(q);
}

static int c_zero(dear_memq_t *q, void *dst, size_t bytes)
{
    if (bytes == 0)
        return DEAR_OK;
    DEAR_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_of(q)));
    return finish_sync(q);
}

static int c_scale(dear_memq_t *q, dear_dtype_t t, void *dst, const void *src, size_t n, double s)
{
    if (s == 1.0)
        return dst == src ? DEAR_OK : c_copy(q, dst, src, n * dear_dtype_size(t));
    return kern_done(q, dear_kern_scale(stream_of(q), t, dst, src, n, s), "scale");
}

static int c_sum(dear_memq_t *q, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n, double s)
{
    return kern_done(q, dear_kern_sum(stream_of(q), t, dst, a, b, n, s), "sum");
}

static int c_widen(dear_memq_t *q, dear_dtype_t t, float *dst, const void *src, size_t n)
{
    return kern_done(q, dear_kern_widen(stream_of(q), t, dst, src, n), "widen");
}

static int c_widen_acc(dear_memq_t *q, dear_dtype_t t, float *acc, const void *src, size_t n)
{
    return kern_done(q, dear_kern_widen_acc(stream_of(q), t, acc, src, n), "widen_acc");
}

static int c_narrow(dear_memq_t *q, dear_dtype_t t, void *dst, const float *src, size_t n, double s)
{
    return kern_done(q, dear_kern_narrow(stream_of(q), t, dst, src, n, s), "narrow");
}

static int c_feedback(dear_memq_t *q, dear_dtype_t t, float *v, float *e, size_t n)
{
    return kern_done(q, dear_kern_feedback(stream_of(q), t, v, e, n), "feedback");
}

/* out must be pinned host memory (alloc with host set): the result is copied there in stream
 * order. Queue NULL borrows a scratch of its own for the call. */
static int c_sumsq(dear_memq_t *q, dear_dtype_t t, const void *src, size_t n, double *out)
{
    if (q == NULL) {
        dear_memq_t tmp = { cudaStreamLegacy, 0, 0, NULL };
        DEAR_CHECK(queue_scratch(&tmp));
        int rc = kern_done(NULL, dear_kern_sumsq(cudaStreamLegacy, t, src, n, tmp.scratch, out), "sumsq");
        cudaFree(tmp.scratch);
        return rc;
    }
    DEAR_CHECK(queue_scratch(q));
    return kern_done(q, dear_kern_sumsq(q->s, t, src, n, q->scratch, out), "sumsq");
}

#define CUDA_ROW(NAME, FLAGS)                                                                  \
    {                                                                                          \
        .name = NAME, .flags = FLAGS, .alloc = c_alloc, .release = c_release,                  \
        .queue_create = c_queue_create, .queue_destroy = c_queue_destroy, .bind = c_bind,      \
        .fence_create = c_fence_create, .fence_destroy = c_fence_destroy,                      \
        .fence_record = c_fence_record, .fence_wait = c_fence_wait, .fence_query = c_fence_query, \
        .copy = c_copy, .zero = c_zero, .scale = c_scale, .sum = c_sum, .widen = c_widen,      \
        .widen_acc = c_widen_acc, .narrow = c_narrow, .sumsq = c_sumsq, .feedback = c_feedback, \
    }

const dear_mem_ops_t dear_cuda_mem_direct_ops = CUDA_ROW("cuda", 0);
const dear_mem_ops_t dear_cuda_mem_staged_ops = CUDA_ROW("cuda-staged", DEAR_MEM_F_STAGE);

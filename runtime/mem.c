/*
 * Where the gradients live, and how communication reaches them through the memory table
 * (collectives/mem.h), in the order the queues need:
 *
 *   backward_done completes a bucket   fence `ready` recorded on the application's queue
 *   the bucket's operation is queued   prepare, on the progress thread: the communication queue
 *                                      waits for `ready`, packs the gradients into the bucket's
 *                                      buffer (a fusion buffer, or the host copy of staged
 *                                      memory) and records `packed`
 *   its collective starts              once `packed` is complete when the host reads the buffer
 *   an all-gather (all-reduce) ends    finish: unpacked on the communication queue, `done` recorded
 *   forward_begin (backward_end)       the application's queue waits for `done` before the updates
 *
 * On host memory every queue is the calling thread, so each fence is complete when recorded;
 * a device row (and the delayed host row of the tests) runs them asynchronously, and a missing
 * wait shows up as a wrong result.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/check.h"
#include "base/params.h"
#include "base/util.h"
#include "base/mpi_check.h"
#include "cuda/cuda.h"
#include "runtime/rt.h"

/* DEAR_DEBUG_DROP_WAIT's choices, in the table's order. */
enum { DROP_NONE, DROP_READY, DROP_PACKED, DROP_DONE };

static const dear_mem_ops_t *host_row = &dear_mem_host_ops;

void dear_rt_mem_set_host_row(const dear_mem_ops_t *ops)
{
    host_row = ops ? ops : &dear_mem_host_ops;
}

/* Host gradients: written by the application's own thread; a queue of the host row (of the
 * tests' delayed row) for the communication's copies. */
static int host_open(dear_ctx_t *ctx)
{
    dear_rt_mem_t *m = &ctx->mem;
    m->ops = host_row;
    m->app = NULL;
    return m->ops->queue_create(&m->comm);
}

static void host_close(dear_ctx_t *ctx)
{
    dear_rt_mem_t *m = &ctx->mem;
    if (m->ops && m->comm)
        m->ops->queue_destroy(m->comm);
}

/* A host pointer is never a device's: a machine without a GPU is not asked about it at all. */
static int host_check(const char *call, const char *name, const char *what, const void *p, size_t bytes)
{
    int dev = -1, ndev = 0;
    if (!dear_cuda_built() || dear_cuda_device_count(&ndev) != DEAR_OK || ndev == 0 ||
        dear_cuda_pointer_device(p, bytes, &dev) != DEAR_OK)
        return DEAR_OK;
    DEAR_ARG_CHECK(dev < 0, "%s('%s'): %s is memory of CUDA device %d, registered as DEAR_MEM_HOST; register it as "
                   "DEAR_MEM_CUDA", call, name, what, dev);
    return DEAR_OK;
}

/* CUDA gradients: the device side (the GPU, the transport, the communication stream), the
 * application's stream as its queue and, under NCCL, the endpoint whose transport runs the
 * gradients' collectives. Collective. */
static int cuda_open(dear_ctx_t *ctx)
{
    dear_rt_mem_t *m = &ctx->mem;
    int want = (int)dear_param_enum(DEAR_P_CUDA_TRANSPORT);
    DEAR_MPI_CHECK(MPI_Bcast(&want, 1, MPI_INT, 0, ctx->cm.comm));
    if (dear_determ_on(ctx) && want != DEAR_CUDA_T_STAGED) {
        /* NCCL's order of the sums follows its own algorithm and the plan's vectors. */
        DEAR_INFO("cuda", "DEAR_DETERMINISTIC=1: CUDA gradients staged, summed by dear's direct exchange");
        want = DEAR_CUDA_T_STAGED;
    }
    DEAR_CHECK(dear_cuda_open(ctx->cm.comm, want, dear_param_double(DEAR_P_CUDA_INIT_TIMEOUT_S), &m->cuda));
    m->ops = dear_cuda_mem(m->cuda);
    m->comm = dear_cuda_comm_queue(m->cuda); /* the device side's, closed with it */
    DEAR_CHECK(dear_cuda_queue_wrap(m->stream, &m->app));
    if (dear_cuda_transport(m->cuda))
        DEAR_CHECK(dear_net_open(dear_cuda_transport(m->cuda), ctx->cm.comm, &m->net));
    return DEAR_OK;
}

static void cuda_close(dear_ctx_t *ctx)
{
    dear_rt_mem_t *m = &ctx->mem;
    if (m->cuda)
        dear_cuda_queue_free(m->app);
    dear_net_close(m->net);
    dear_cuda_close(m->cuda);
}

/* A device pointer of the current device, one allocation. */
static int cuda_check(const char *call, const char *name, const char *what, const void *p, size_t bytes)
{
    int dev = -1, cur = -1;
    int rc = dear_cuda_pointer_device(p, bytes, &dev);
    if (rc == DEAR_ERR_UNSUPPORTED) {
        DEAR_ERROR("api", "%s('%s'): DEAR_MEM_CUDA, but this libdear was built without CUDA (configure "
                          "--with-cuda)", call, name);
        return DEAR_ERR_UNSUPPORTED;
    }
    if (rc != DEAR_OK) {
        DEAR_ERROR("api", "%s('%s'): DEAR_MEM_CUDA, but the CUDA runtime cannot say what %s is (no GPU or "
                          "no driver?)", call, name, what);
        return DEAR_ERR_CUDA;
    }
    DEAR_ARG_CHECK(dev >= 0, "%s('%s'): %s (%zu bytes) is host memory or not one device allocation, "
                   "registered as DEAR_MEM_CUDA; register device memory of the current device, or DEAR_MEM_HOST",
                   call, name, what, bytes);
    DEAR_CHECK(dear_cuda_current_device(&cur));
    DEAR_ARG_CHECK(dev == cur, "%s('%s'): %s is memory of CUDA device %d, but this thread's current "
                   "device is %d; call cudaSetDevice(%d) first (every tensor of a context on one GPU)",
                   call, name, what, dev, cur, dev);
    return DEAR_OK;
}

/* The kinds of memory a tensor can lie in, one row per dear_mem_t: what the registry checks of a
 * pointer, and how a context opens (at commit) and closes the memory table's row and the queues
 * that reach it. A kind is a row here and a row of the memory table (collectives/mem.h).
 *   streams  the application's queue is its CUDA stream (dear_set_stream), handed to the updates */
static const struct {
    const char *name;
    int streams;
    int (*check)(const char *call, const char *name, const char *what, const void *p, size_t bytes);
    int (*open)(dear_ctx_t *ctx);
    void (*close)(dear_ctx_t *ctx);
} kinds[] = {
    [DEAR_MEM_HOST] = { "DEAR_MEM_HOST", 0, host_check, host_open, host_close },
    [DEAR_MEM_CUDA] = { "DEAR_MEM_CUDA", 1, cuda_check, cuda_open, cuda_close },
};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

const char *dear_rt_mem_kind_name(dear_mem_t kind)
{
    return (unsigned)kind < (unsigned)NKINDS ? kinds[kind].name : "unknown";
}

int dear_rt_mem_kind_valid(const char *call, const char *name, dear_mem_t kind)
{
    if ((unsigned)kind < (unsigned)NKINDS)
        return DEAR_OK;
    char list[128] = "";
    size_t n = 0;
    for (int k = 0; k < NKINDS && n < sizeof list; k++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s (%d)", k ? ", " : "", kinds[k].name, k);
    DEAR_ERROR("api", "%s('%s'): memory kind %d unknown; accepted: %s", call, name, (int)kind, list);
    return DEAR_ERR_ARG;
}

int dear_rt_mem_check(const char *call, const char *name, const char *what, const void *p, size_t bytes,
                      dear_mem_t kind)
{
    DEAR_CHECK(dear_rt_mem_kind_valid(call, name, kind));
    return kinds[kind].check(call, name, what, p, bytes);
}

void *dear_rt_mem_stream(const dear_ctx_t *ctx)
{
    return kinds[ctx->mem.kind].streams ? ctx->mem.stream : NULL;
}

int dear_rt_mem_setup(dear_ctx_t *ctx)
{
    dear_rt_mem_t *m = &ctx->mem;
    m->drop = (int)dear_param_enum(DEAR_P_DEBUG_DROP_WAIT);
    m->kind = ctx->reg.ntensors > 0 ? ctx->reg.tensors[0].mem : DEAR_MEM_HOST;
    for (int t = 1; t < ctx->reg.ntensors; t++)
        if (ctx->reg.tensors[t].mem != m->kind) {
            DEAR_ERROR("api", "dear_commit: tensor '%s' is %s and '%s' %s: a context's tensors all lie in one kind of "
                              "memory (one context per kind)",
                       ctx->reg.tensors[t].name, kinds[ctx->reg.tensors[t].mem].name, ctx->reg.tensors[0].name,
                       kinds[m->kind].name);
            return DEAR_ERR_UNSUPPORTED;
        }
    DEAR_CHECK(kinds[m->kind].open(ctx));
    m->staged = (m->ops->flags & DEAR_MEM_F_STAGE) != 0;
    return m->ops->fence_create(&m->idle);
}

/* Nothing enqueued on the communication queue still runs (before its buffers are freed). */
int dear_rt_mem_quiesce(const dear_ctx_t *ctx)
{
    const dear_rt_mem_t *m = &ctx->mem;
    if (m->ops == NULL || m->comm == NULL)
        return DEAR_OK;
    DEAR_CHECK(m->ops->fence_record(m->idle, m->comm));
    return m->ops->fence_wait(NULL, m->idle);
}

void dear_rt_mem_free(dear_ctx_t *ctx)
{
    dear_rt_mem_t *m = &ctx->mem;
    if (m->ops) {
        dear_rt_mem_quiesce(ctx);
        dear_rt_fence_free(ctx, m->idle);
    }
    kinds[m->kind].close(ctx);
    void *stream = m->stream;
    *m = (dear_rt_mem_t){ .stream = stream };
}

int dear_rt_fence_new(const dear_ctx_t *ctx, dear_fence_t **f)
{
    return ctx->mem.ops->fence_create(f);
}

void dear_rt_fence_free(const dear_ctx_t *ctx, dear_fence_t *f)
{
    if (f)
        ctx->mem.ops->fence_destroy(f);
}

int dear_rt_wait_done(const dear_ctx_t *ctx, dear_fence_t *done)
{
    if (ctx->mem.drop == DROP_DONE)
        return DEAR_OK;
    return ctx->mem.ops->fence_wait(ctx->mem.app, done);
}

int dear_rt_done_query(const dear_ctx_t *ctx, dear_fence_t *done, int *ready)
{
    *ready = 1;
    if (ctx->mem.drop == DROP_DONE)
        return DEAR_OK;
    return dear_fence_done(ctx->mem.ops, done, ready);
}

int dear_rt_zero(const dear_ctx_t *ctx, void *grad, size_t bytes)
{
    return ctx->mem.ops->zero(ctx->mem.app, grad, bytes);
}

/* Units [u0, u1) of bucket b (those of them in it) between its buffer and the gradients. */
static int bucket_copy(const dear_ctx_t *ctx, const dear_bucket_t *b, int u0, int u1, int to_buf)
{
    size_t esz = dear_dtype_size(b->dtype);
    if (u0 < b->u0)
        u0 = b->u0;
    if (u1 > b->u1)
        u1 = b->u1;
    for (int u = u0; u < u1; u++) {
        size_t c = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
        if (c == 0)
            continue;
        char *at = (char *)b->buf + ctx->graph.units[u].off * esz, *grad = dear_unit_grad(&ctx->graph, &ctx->reg, u);
        DEAR_CHECK(ctx->mem.ops->copy(ctx->mem.comm, to_buf ? at : grad, to_buf ? grad : at, c * esz));
    }
    return DEAR_OK;
}

int dear_rt_bucket_ready(const dear_ctx_t *ctx, dear_bucket_t *b)
{
    return ctx->mem.ops->fence_record(b->ready, ctx->mem.app);
}

/* The bucket's operation is queued: its gradients go into its buffer on the communication queue,
 * behind the application's writes. */
static int bucket_prepare(dear_ctx_t *ctx, dear_op_t *op)
{
    dear_bucket_t *b = &ctx->graph.buckets[op->index];
    const dear_mem_ops_t *mo = ctx->mem.ops;
    if (ctx->mem.drop != DROP_READY)
        DEAR_CHECK(mo->fence_wait(ctx->mem.comm, b->ready));
    if (!b->fused)
        return DEAR_OK;
    DEAR_CHECK(bucket_copy(ctx, b, b->u0, b->u1, 1));
    DEAR_CHECK(mo->fence_record(b->packed, ctx->mem.comm));
    /* A collective on the host reads the buffer: it starts once the copies have run. One the
     * transport runs on the communication queue itself follows them there. */
    if (ctx->mem.net == NULL && ctx->mem.drop != DROP_PACKED)
        op->pt.start_fence = b->packed;
    return DEAR_OK;
}

/* An all-reduce (wfbp, sync) ended: the whole bucket back to the gradients. */
static int bucket_finish(dear_ctx_t *ctx, dear_op_t *op)
{
    dear_bucket_t *b = &ctx->graph.buckets[op->index];
    if (b->fused)
        DEAR_CHECK(bucket_copy(ctx, b, b->u0, b->u1, 0));
    return ctx->mem.ops->fence_record(b->done, ctx->mem.comm);
}

/* An all-gather ended: the group's units back to the gradients, from every fused bucket. */
static int group_finish(dear_ctx_t *ctx, dear_op_t *op)
{
    dear_group_t *gr = &ctx->graph.groups[op->index];
    int b0 = ctx->graph.units[gr->u0].bucket, b1 = ctx->graph.units[gr->u1 - 1].bucket;
    for (int b = b0; b <= b1; b++)
        if (ctx->graph.buckets[b].fused)
            DEAR_CHECK(bucket_copy(ctx, &ctx->graph.buckets[b], gr->u0, gr->u1, 0));
    return ctx->mem.ops->fence_record(gr->done, ctx->mem.comm);
}

/* ---- sharded updates: the reduce-scatters feed the updates, the all-gathers carry parameters ---- */

int dear_rt_shard_unpack(const dear_ctx_t *ctx, dear_bucket_t *b)
{
    size_t esz = dear_dtype_size(b->dtype);
    for (int u = b->u0; u < b->u1 && b->fused; u++) {
        const dear_rt_unit_t *un = &ctx->graph.units[u];
        if (un->own_len == 0 || dear_unit_ccount(&ctx->graph, &ctx->reg, u) == 0)
            continue;
        char *at = (char *)b->buf + (un->off + un->own_off) * esz;
        char *grad = dear_unit_grad(&ctx->graph, &ctx->reg, u) + un->own_off * esz;
        DEAR_CHECK(ctx->mem.ops->copy(ctx->mem.comm, grad, at, un->own_len * esz));
    }
    return ctx->mem.ops->fence_record(b->done, ctx->mem.comm);
}

/* Without clipping (whose norm scales the slices first, clip.c) the slices are final here. */
static int shard_rs_finish(dear_ctx_t *ctx, dear_op_t *op)
{
    return dear_rt_shard_unpack(ctx, &ctx->graph.buckets[op->index]);
}

/* Where unit u's parameters lie, from element i on. */
static char *unit_param(const dear_ctx_t *ctx, int u, size_t i)
{
    const dear_rt_unit_t *un = &ctx->graph.units[u];
    const dear_tensor_t *tt = &ctx->reg.tensors[un->tensor];
    return (char *)tt->param + (un->eoff + i) * dear_dtype_size(tt->dtype);
}

/* The all-gather sends what the updates wrote on the application's queue: the communication
 * queue waits for them and copies this rank's slices into a staged copy. */
static int shard_ag_prepare(dear_ctx_t *ctx, dear_op_t *op)
{
    dear_group_t *gr = &ctx->graph.groups[op->index];
    const dear_mem_ops_t *mo = ctx->mem.ops;
    int staged = 0;
    if (ctx->mem.drop != DROP_READY)
        DEAR_CHECK(mo->fence_wait(ctx->mem.comm, dear_shard_updated(ctx, op->index)));
    for (int u = gr->u0; u < gr->u1; u++) {
        const dear_rt_unit_t *un = &ctx->graph.units[u];
        const dear_bucket_t *bk = &ctx->graph.buckets[un->bucket];
        if (!bk->fused || un->own_len == 0 || dear_unit_ccount(&ctx->graph, &ctx->reg, u) == 0)
            continue;
        size_t esz = dear_dtype_size(bk->dtype);
        staged = 1;
        DEAR_CHECK(mo->copy(ctx->mem.comm, (char *)bk->pbuf + (un->off + un->own_off) * esz,
                            unit_param(ctx, u, un->own_off), un->own_len * esz));
    }
    if (staged) {
        DEAR_CHECK(mo->fence_record(gr->packed, ctx->mem.comm));
        if (ctx->mem.net == NULL && ctx->mem.drop != DROP_PACKED)
            op->pt.start_fence = gr->packed;
    } else if (ctx->mem.net == NULL && ctx->mem.drop != DROP_READY) {
        op->pt.start_fence = dear_shard_updated(ctx, op->index); /* the host reads the parameters in place */
    }
    return DEAR_OK;
}

/* An all-gather of parameters ended: from a staged copy back to the parameters, then `done`. */
static int shard_ag_finish(dear_ctx_t *ctx, dear_op_t *op)
{
    dear_group_t *gr = &ctx->graph.groups[op->index];
    for (int u = gr->u0; u < gr->u1; u++) {
        const dear_rt_unit_t *un = &ctx->graph.units[u];
        const dear_bucket_t *bk = &ctx->graph.buckets[un->bucket];
        size_t c = dear_unit_ccount(&ctx->graph, &ctx->reg, u), esz = dear_dtype_size(bk->dtype);
        if (bk->fused && c > 0)
            DEAR_CHECK(ctx->mem.ops->copy(ctx->mem.comm, unit_param(ctx, u, 0), (char *)bk->pbuf + un->off * esz,
                                          c * esz));
    }
    return ctx->mem.ops->fence_record(gr->done, ctx->mem.comm);
}

int dear_rt_mem_graph(dear_ctx_t *ctx)
{
    int shard = dear_shard_on(ctx);
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        DEAR_CHECK(dear_rt_fence_new(ctx, &bk->ready));
        DEAR_CHECK(dear_rt_fence_new(ctx, &bk->packed));
        DEAR_CHECK(dear_rt_fence_new(ctx, &bk->done));
        bk->op.prepare = bucket_prepare;
        if (bk->op.kind == DEAR_COLL_ALLREDUCE)
            bk->op.finish = bucket_finish;
        else if (shard && !dear_clip_on(ctx))
            bk->op.finish = shard_rs_finish;
    }
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        dear_group_t *gr = &ctx->graph.groups[g];
        DEAR_CHECK(dear_rt_fence_new(ctx, &gr->done));
        gr->op.finish = shard ? shard_ag_finish : group_finish;
        if (shard) {
            DEAR_CHECK(dear_rt_fence_new(ctx, &gr->packed));
            gr->op.prepare = shard_ag_prepare;
        }
    }
    return DEAR_OK;
}

void dear_rt_mem_graph_free(dear_ctx_t *ctx)
{
    dear_rt_mem_quiesce(ctx); /* no copy or collective still uses the buffers */
    for (int b = 0; ctx->graph.buckets && b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        dear_rt_fence_free(ctx, bk->ready);
        dear_rt_fence_free(ctx, bk->packed);
        dear_rt_fence_free(ctx, bk->done);
        if (bk->fused)
            ctx->mem.ops->release(bk->buf, ctx->mem.staged);
        if (bk->pbuf)
            ctx->mem.ops->release(bk->pbuf, ctx->mem.staged);
    }
    for (int g = 0; ctx->graph.groups && g < ctx->graph.ngroups; g++) {
        dear_rt_fence_free(ctx, ctx->graph.groups[g].done);
        dear_rt_fence_free(ctx, ctx->graph.groups[g].packed);
    }
}

/* The gradients lie in CUDA memory (dear_rt_mem_setup refuses a mix of kinds). */
static int cuda_is_on(const dear_ctx_t *ctx)
{
    return ctx->reg.ntensors > 0 && ctx->reg.tensors[0].mem == DEAR_MEM_CUDA;
}

/* Gradients in CUDA memory: a row of the feature table for the pairs it refuses (the other rows
 * say which); the memory itself is opened above, by its row of the kinds. */
const dear_feature_t dear_feature_cuda = {
    .on = cuda_is_on,
};

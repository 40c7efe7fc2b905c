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
#include <stdlib.h>

#include "base/check.h"
#include "base/params.h"
#include "base/util.h"
#include "runtime/rt.h"

/* DEAR_DEBUG_DROP_WAIT's choices, in the table's order. */
enum { DROP_NONE, DROP_READY, DROP_PACKED, DROP_DONE };

static const dear_mem_ops_t *host_row = &dear_mem_host_ops;

void dear_rt_mem_set_host_row(const dear_mem_ops_t *ops)
{
    host_row = ops ? ops : &dear_mem_host_ops;
}

int dear_rt_mem_setup(dear_ctx_t *ctx)
{
    dear_rt_mem_t *m = &ctx->mem;
    m->ops = host_row;
    m->staged = (m->ops->flags & DEAR_MEM_F_STAGE) != 0;
    m->drop = (int)dear_param_enum(DEAR_P_DEBUG_DROP_WAIT);
    m->app = NULL; /* host gradients are written by the application's own thread */
    return m->ops->queue_create(&m->comm);
}

void dear_rt_mem_free(dear_ctx_t *ctx)
{
    if (ctx->mem.ops && ctx->mem.comm)
        ctx->mem.ops->queue_destroy(ctx->mem.comm);
    ctx->mem.comm = NULL;
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
    /* The host's collective reads the buffer: it starts once the copies have run. */
    op->start_fence = ctx->mem.drop == DROP_PACKED ? NULL : b->packed;
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

int dear_rt_mem_graph(dear_ctx_t *ctx)
{
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        DEAR_CHECK(dear_rt_fence_new(ctx, &bk->ready));
        DEAR_CHECK(dear_rt_fence_new(ctx, &bk->packed));
        DEAR_CHECK(dear_rt_fence_new(ctx, &bk->done));
        bk->op.prepare = bucket_prepare;
        if (bk->op.kind == DEAR_COLL_ALLREDUCE)
            bk->op.finish = bucket_finish;
    }
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        DEAR_CHECK(dear_rt_fence_new(ctx, &ctx->graph.groups[g].done));
        ctx->graph.groups[g].op.finish = group_finish;
    }
    return DEAR_OK;
}

void dear_rt_mem_graph_free(dear_ctx_t *ctx)
{
    for (int b = 0; ctx->graph.buckets && b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        dear_rt_fence_free(ctx, bk->ready);
        dear_rt_fence_free(ctx, bk->packed);
        dear_rt_fence_free(ctx, bk->done);
        if (bk->fused)
            ctx->mem.ops->release(bk->buf, ctx->mem.staged);
    }
    for (int g = 0; ctx->graph.groups && g < ctx->graph.ngroups; g++)
        dear_rt_fence_free(ctx, ctx->graph.groups[g].done);
}

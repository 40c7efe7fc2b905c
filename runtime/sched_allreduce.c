/*
 * Schedules `wfbp` and `sync`: every bucket is one all-reduce. wfbp queues a bucket's
 * all-reduce as soon as backward completes it (Horovod, PyTorch DDP); sync queues them all after
 * backward (no overlap: the floor to beat). Both wait at backward_end for every bucket to be back
 * in the gradients and run every update in forward order, so nothing is pending between iterations.
 * Under sharded updates both reduce-scatter, update this rank's slices and gather the parameters
 * (shard.c), still before backward_end returns.
 */
#include "base/check.h"
#include "base/util.h"
#include "runtime/rt.h"

/* Wait for every bucket to be back in the gradients, run all updates in forward order. */
static int reduce_and_update(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    double t0 = dear_now();
    for (int i = 0; i < ctx->graph.nops; i++)
        DEAR_CHECK(dear_engine_wait(ctx, ctx->graph.ops[i], ctx->it.iter));
    double t1 = dear_now();
    if (ctx->tl && t1 - t0 > 2e-6)
        dear_timeline_span(ctx->tl, "wait dear_backward_end", "wait", DEAR_LANE_WAIT, t0, t1, NULL);
    for (int b = 0; b < ctx->graph.nbuckets; b++) /* unpacked by the progress thread (mem.c) */
        DEAR_CHECK(dear_rt_wait_done(ctx, ctx->graph.buckets[b].done));
    if (dear_clip_on(ctx))
        DEAR_CHECK(dear_clip_averaged(ctx));
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        if (!dear_tensor_updates(ctx, t))
            continue;
        int r = dear_call_update(ctx, t, ctx->it.iter); /* before backward_end counts it */
        if (r != DEAR_OK && rc == DEAR_OK)
            rc = r;
    }
    return rc;
}

static void wfbp_bucket_done(dear_ctx_t *ctx, dear_bucket_t *b)
{
    dear_engine_queue(ctx, &b->op);
}

static int wfbp_backward_end(dear_ctx_t *ctx)
{
    if (dear_shard_on(ctx))
        return dear_shard_backward_end(ctx);
    dear_graph_queue_barriers(ctx); /* the only operations not queued in backward */
    return reduce_and_update(ctx);
}

static int sync_backward_end(dear_ctx_t *ctx)
{
    if (dear_shard_on(ctx))
        return dear_shard_backward_end(ctx);
    for (int i = 0; i < ctx->graph.nops; i++)
        dear_engine_queue(ctx, ctx->graph.ops[i]);
    return reduce_and_update(ctx);
}

const dear_sched_ops_t dear_sched_wfbp_ops = {
    .bucket_op = DEAR_COLL_ALLREDUCE,
    .bucket_done = wfbp_bucket_done,
    .backward_end = wfbp_backward_end,
};

const dear_sched_ops_t dear_sched_sync_ops = {
    .bucket_op = DEAR_COLL_ALLREDUCE,
    .backward_end = sync_backward_end,
};

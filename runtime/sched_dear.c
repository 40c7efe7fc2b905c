/*
 * Schedule `dear`: a bucket's reduce-scatter is queued as soon as backward completes it; at
 * backward_end the all-gather groups are queued in forward order behind the reduce-scatters
 * (the plan's early groups were already queued during backward, each behind the bucket that
 * completes its data), and every tensor's update becomes pending. The next iteration's
 * forward_begin of a layer waits only for the groups holding its units (a cut tensor's chunks
 * may lie in several) to be back in the gradients and runs the layer's updates, each tensor's once all its
 * chunks are in place, and those of the later layers whose gradients those groups hold too; flush
 * completes every pending group and update.
 */
#include <stdio.h>

#include "base/check.h"
#include "base/util.h"
#include "runtime/rt.h"

/* Run tensor t's deferred update if it is still pending. */
static int run_update(dear_ctx_t *ctx, int t)
{
    if (!ctx->reg.tensors[t].pending)
        return DEAR_OK;
    ctx->reg.tensors[t].pending = 0;
    ctx->it.npending--;
    /* Sharded: its slices were updated at backward_end; only its parameters arrived. The count
     * of ranks with a gradient is in: group_ready waited for it. */
    if (dear_shard_on(ctx) || !dear_tensor_updates(ctx, t))
        return DEAR_OK;
    return dear_call_update(ctx, t, ctx->it.iter - 1); /* pending since the last backward_end */
}

/* Every pending update of layer K; the first error is kept in *rc and the rest still run. */
static void run_layer(dear_ctx_t *ctx, const dear_layer_t *K, int *rc)
{
    for (int t = K->t0; t < K->t1; t++) {
        int r = run_update(ctx, t);
        if (r != DEAR_OK && *rc == DEAR_OK)
            *rc = r;
    }
}

int dear_group_ready(dear_ctx_t *ctx, int g, const char *call, int lidx)
{
    dear_group_t *gr = &ctx->graph.groups[g];
    if (gr->unpacked)
        return DEAR_OK;
    double t0 = dear_now();
    DEAR_CHECK(dear_engine_wait(ctx, &gr->op, ctx->it.iter - 1));
    if (gr->early) /* its updates need the barriers (the count of ranks with a gradient); it ran before them */
        DEAR_CHECK(dear_graph_wait_barriers(ctx, ctx->it.iter - 1));
    double t1 = dear_now();
    if (ctx->tl && t1 - t0 > 2e-6) {
        char name[80], args[96];
        snprintf(name, sizeof name, "wait %s", call);
        snprintf(args, sizeof args, "\"group\":%d,\"layer\":%d", g, lidx >= 0 ? ctx->reg.layers[lidx].id : -1);
        dear_timeline_span(ctx->tl, name, "wait", DEAR_LANE_WAIT, t0, t1, args);
    }
    DEAR_CHECK(dear_rt_wait_done(ctx, gr->done)); /* unpacked by the progress thread (mem.c) */
    gr->unpacked = 1;
    return DEAR_OK;
}

static int dear_forward_layer(dear_ctx_t *ctx, int lidx)
{
    int rc = DEAR_OK;
    const dear_layer_t *L = &ctx->reg.layers[lidx];
    if (ctx->it.npending == 0 || L->t0 == L->t1)
        return DEAR_OK;
    /* Every group holding a chunk of the layer's tensors, then each tensor's update once. */
    int g0 = dear_group_of(&ctx->graph, L->u0), g1 = dear_group_of(&ctx->graph, L->u1 - 1);
    for (int g = g0; g <= g1; g++)
        DEAR_CHECK(dear_group_ready(ctx, g, "dear_forward_begin", lidx));
    /* The layer's updates, then those of the later layers whose units lie wholly in the groups
     * now in place: a caller that steps whatever its callbacks reported (the Python binding)
     * then runs one optimizer step per group instead of one per layer, at the same total work.
     * Units are laid out in layer order, so the scan stops at the first layer reaching past g1.
     * Within layers an earlier call of this pass scanned, the scan resumes where that one
     * stopped; a layer's own updates always run here, so the shortcut never leaves one pending. */
    int k = lidx + 1;
    if (ctx->it.scan_iter == ctx->it.iter && lidx >= ctx->it.scan_lo && lidx < ctx->it.scan_hi) {
        k = ctx->it.scan_hi;
    } else {
        ctx->it.scan_lo = lidx;
        ctx->it.scan_iter = ctx->it.iter;
    }
    run_layer(ctx, L, &rc);
    for (; k < ctx->reg.nlayers; k++) {
        const dear_layer_t *K = &ctx->reg.layers[k];
        if (K->t0 < K->t1 && dear_group_of(&ctx->graph, K->u1 - 1) > g1)
            break;
        run_layer(ctx, K, &rc);
    }
    ctx->it.scan_hi = k;
    return rc;
}

/* The averaged gradients of layer lidx in place, its updates still pending (dear_wait_grad). */
static int dear_wait_layer(dear_ctx_t *ctx, int lidx)
{
    const dear_layer_t *L = &ctx->reg.layers[lidx];
    if (ctx->it.npending == 0 || L->t0 == L->t1)
        return DEAR_OK;
    int g0 = dear_group_of(&ctx->graph, L->u0), g1 = dear_group_of(&ctx->graph, L->u1 - 1);
    for (int g = g0; g <= g1; g++)
        DEAR_CHECK(dear_group_ready(ctx, g, "dear_wait_grad", lidx));
    return DEAR_OK;
}

/* The bucket's reduce-scatter, then the early all-gather groups it completes: they start once
 * it is reduced. Sharded, they carry parameters: they follow its slices' updates (shard.c). */
static void dear_bucket_done(dear_ctx_t *ctx, dear_bucket_t *b)
{
    dear_engine_queue(ctx, &b->op);
    if (dear_shard_on(ctx))
        return;
    for (int g = b->early_hi; g >= b->early_lo; g--) {
        if (!ctx->graph.groups[g].early)
            continue;
        ctx->graph.groups[g].unpacked = 0;
        dear_engine_queue(ctx, &ctx->graph.groups[g].op);
    }
}

static int dear_backward_end_sched(dear_ctx_t *ctx)
{
    if (dear_shard_on(ctx))
        return dear_shard_backward_end(ctx);
    dear_graph_queue_barriers(ctx); /* between the reduce-scatters and all-gathers */
    /* Behind the reduce-scatters, in forward order: the first layers' groups arrive first (the
     * early ones were queued during backward). */
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        if (ctx->graph.groups[g].early)
            continue;
        ctx->graph.groups[g].unpacked = 0;
        dear_engine_queue(ctx, &ctx->graph.groups[g].op);
    }
    ctx->it.npending = 0;
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        ctx->reg.tensors[t].pending = !ctx->reg.tensors[t].frozen;
        ctx->it.npending += ctx->reg.tensors[t].pending;
    }
    return DEAR_OK;
}

/* Every pending group in forward order, each followed by the updates of the tensors whose last
 * chunk it holds (their earlier chunks were in earlier groups). */
static int dear_flush_sched(dear_ctx_t *ctx, const char *call)
{
    int rc = DEAR_OK;
    if (ctx->it.npending == 0)
        return DEAR_OK;
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        DEAR_CHECK(dear_group_ready(ctx, g, call, -1));
        for (int u = ctx->graph.groups[g].u0; u < ctx->graph.groups[g].u1; u++) {
            int t = ctx->graph.units[u].tensor;
            if (ctx->reg.tensors[t].u1 - 1 != u)
                continue;
            int r = run_update(ctx, t);
            if (r != DEAR_OK && rc == DEAR_OK)
                rc = r;
        }
    }
    return rc;
}

/* Before a plan switch: this iteration's all-gathers are waited for and their data put in
 * place; the updates stay pending and still run in the next forward passes. */
static int dear_drain(dear_ctx_t *ctx)
{
    if (ctx->it.npending > 0)
        for (int g = 0; g < ctx->graph.ngroups; g++)
            DEAR_CHECK(dear_group_ready(ctx, g, "dear_backward_end", -1));
    return DEAR_OK;
}

const dear_sched_ops_t dear_sched_dear_ops = {
    .bucket_op = DEAR_COLL_REDUCE_SCATTER,
    .forward_layer = dear_forward_layer,
    .bucket_done = dear_bucket_done,
    .backward_end = dear_backward_end_sched,
    .flush = dear_flush_sched,
    .drain = dear_drain,
    .wait_layer = dear_wait_layer,
};

/*
 * Clipping by global norm. The update of every tensor sees its gradient multiplied by
 * min(1, max_norm / (norm + 1e-6)), where norm is the L2 norm of the whole averaged gradient
 * (as torch.nn.utils.clip_grad_norm_), and is told the norm and the factor.
 *
 * Schedule dear computes the norm from shards, as ZeRO and FSDP do: once a bucket is
 * reduce-scattered each rank holds its averaged shard and adds up its squares (the progress
 * thread, a pass over 1/P of the bucket); one scalar all-reduce after the last reduce-scatter sums
 * them over the ranks, and each rank scales its shards before any all-gather starts. The
 * gradient is never read whole, and the all-gathers keep their overlap with the next forward
 * pass; the plan's early all-gathers are given up (they would gather unclipped shards).
 * Schedules wfbp and sync hold the whole averaged gradient after backward_end: every rank adds
 * up its squares in the same order (the same value everywhere) and scales it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/params.h"
#include "base/util.h"
#include "collectives/reduce.h"
#include "runtime/rt.h"

/* As torch.nn.utils.clip_grad_norm_: a zero gradient is left as it is. */
#define CLIP_EPS 1e-6

void dear_clip_setup(dear_ctx_t *ctx)
{
    if (!ctx->clip.on) {
        double p = dear_param_double(DEAR_P_CLIP_NORM);
        ctx->clip.on = p > 0;
        ctx->clip.max_norm = p;
    }
    ctx->clip.iter = -1;
    ctx->clip.norm = -1;
    ctx->clip.coef = 1;
}

static void set_result(dear_ctx_t *ctx, double sumsq, long long iter)
{
    double norm = sqrt(sumsq), coef = ctx->clip.max_norm / (norm + CLIP_EPS);
    ctx->clip.norm = norm;
    ctx->clip.coef = coef < 1 ? coef : 1;
    ctx->clip.iter = iter;
}

static void shard_sq(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_bucket_t *bk = &ctx->graph.buckets[op->index];
    double s = 0;
    for (int k = 0; k < dear_bucket_parts(bk); k++) {
        size_t len;
        const char *p = dear_bucket_own(ctx, bk, k, &len);
        s += dear_reduce_sumsq(bk->dtype, p, len);
    }
    ctx->clip.shard_sq[op->index] = s;
}

static void norm_before(dear_ctx_t *ctx, dear_op_t *op)
{
    double s = 0;
    for (int b = 0; b < ctx->graph.nbuckets; b++) /* bucket order: the same sum on every rank */
        s += ctx->clip.shard_sq[b];
    ctx->clip.sum = s;
}

static void norm_after(dear_ctx_t *ctx, dear_op_t *op)
{
    set_result(ctx, ctx->clip.sum, op->iter);
    if (ctx->clip.coef == 1)
        return;
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        const dear_bucket_t *bk = &ctx->graph.buckets[b];
        for (int k = 0; k < dear_bucket_parts(bk); k++) {
            size_t len;
            char *p = dear_bucket_own(ctx, bk, k, &len);
            dear_reduce_scale(bk->dtype, p, p, len, ctx->clip.coef);
        }
    }
}

int dear_clip_graph(dear_ctx_t *ctx, int pos)
{
    int rc = DEAR_OK;
    dear_op_t *op = &ctx->clip.op; /* its deps and shard_sq were freed with the last graph */
    memset(op, 0, sizeof *op);
    size_t nb = (size_t)ctx->graph.nbuckets;
    DEAR_ALLOC_GOTO(ctx->clip.shard_sq, calloc(nb, sizeof(double)), nb * sizeof(double), rc, out);
    DEAR_ALLOC_GOTO(op->deps, calloc(nb, sizeof *op->deps), nb * sizeof *op->deps, rc, out);
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        op->deps[b] = &ctx->graph.buckets[b].op;
        ctx->graph.buckets[b].op.after = shard_sq;
    }
    op->ndeps = ctx->graph.nbuckets;
    dear_op_sum(ctx, op, pos, -1, DEAR_FLOAT64, &ctx->clip.sum, 1);
    op->before = norm_before;
    op->after = norm_after;
out:
    return rc;
}

void dear_clip_averaged(dear_ctx_t *ctx)
{
    double s = 0;
    for (int t = 0; t < ctx->reg.ntensors; t++)
        if (!ctx->reg.tensors[t].frozen)
            s += dear_reduce_sumsq(ctx->reg.tensors[t].dtype, ctx->reg.tensors[t].grad, ctx->reg.tensors[t].count);
    set_result(ctx, s, ctx->it.iter);
    for (int t = 0; ctx->clip.coef != 1 && t < ctx->reg.ntensors; t++)
        if (!ctx->reg.tensors[t].frozen)
            dear_reduce_scale(ctx->reg.tensors[t].dtype, ctx->reg.tensors[t].grad, ctx->reg.tensors[t].grad,
                          ctx->reg.tensors[t].count, ctx->clip.coef);
}

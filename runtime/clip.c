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
 *
 * Under DEAR_DETERMINISTIC the squares are added exactly (base/xsum.h), on the host (the mode
 * stages CUDA memory): how a plan cuts the gradient into buckets, units and shards, and whether
 * it is sharded, then changes nothing in the norm, which is the exact sum rounded once. The norm's
 * collective sums the exported words, exactly in any order.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/params.h"
#include "base/util.h"
#include "base/xsum.h"
#include "collectives/reduce.h"
#include "runtime/rt.h"

/* As torch.nn.utils.clip_grad_norm_: a zero gradient is left as it is. */
#define CLIP_EPS 1e-6

static int set_clip_norm_claimed(dear_ctx_t *ctx, double max_norm)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_set_clip_norm: ctx is NULL");
    DEAR_ARG_CHECK(max_norm >= 0 && !isnan(max_norm),
                   "dear_set_clip_norm: max_norm %g; accepted: 0 (off), a positive norm, or INFINITY (report the "
                   "norm, clip nothing)",
                   max_norm);
    if (ctx->committed && !ctx->clip.on && max_norm > 0) {
        DEAR_ERROR("api", "dear_set_clip_norm(%g): clipping was off at dear_commit; turn it on before dear_commit "
                          "(or with DEAR_CLIP_NORM), since its collective is part of the plan",
                   max_norm);
        return DEAR_ERR_STATE;
    }
    if (ctx->committed && max_norm == 0)
        max_norm = INFINITY; /* the collective stays; nothing is clipped any more */
    ctx->clip.on = max_norm > 0;
    ctx->clip.max_norm = max_norm;
    return DEAR_OK;
}

int dear_set_clip_norm(dear_ctx_t *ctx, double max_norm)
{
    DEAR_CLAIMED(ctx, "dear_set_clip_norm", set_clip_norm_claimed(ctx, max_norm));
}

int dear_clip_on(const dear_ctx_t *ctx) { return ctx->clip.on; }

int dear_clip_result(const dear_ctx_t *ctx, long long iteration, double *norm, double *coef)
{
    if (!ctx->clip.on || ctx->clip.iter != iteration)
        return 0;
    *norm = ctx->clip.norm;
    *coef = ctx->clip.coef;
    return 1;
}

/* DEAR_CLIP_NORM unless dear_set_clip_norm turned it on. */
static int clip_decide(dear_ctx_t *ctx)
{
    if (!ctx->clip.on) {
        double p = dear_param_double(DEAR_P_CLIP_NORM);
        ctx->clip.on = p > 0;
        ctx->clip.max_norm = p;
    }
    ctx->clip.iter = -1;
    ctx->clip.norm = -1;
    ctx->clip.coef = 1;
    return DEAR_OK;
}

static void set_result(dear_ctx_t *ctx, double sumsq, long long iter)
{
    double norm = sqrt(sumsq), coef = ctx->clip.max_norm / (norm + CLIP_EPS);
    ctx->clip.norm = norm;
    ctx->clip.coef = coef < 1 ? coef : 1;
    ctx->clip.iter = iter;
}

/* xs += the square of every element of v (n of type t, host memory), each square exact or, for
 * float64, rounded once: a function of the element alone. */
static void add_squares(dear_xsum_t *xs, dear_dtype_t t, const void *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double x = dear_elem_get(t, v, i);
        dear_xsum_add(xs, x * x);
    }
}

/* The squares of this rank's reduced shard of the bucket, part by part, on the buffers' queue;
 * the norm's collective waits for them (norm_prepare). Deterministic: added exactly, here. */
static void shard_sq(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_bucket_t *bk = &ctx->graph.buckets[op->index];
    if (ctx->clip.xs) {
        for (int k = 0; k < dear_bucket_parts(bk); k++) {
            size_t len;
            const char *p = dear_bucket_own(&ctx->cm, bk, k, &len);
            add_squares(ctx->clip.xs, bk->dtype, p, len);
        }
        return;
    }
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    int nparts = dear_bucket_parts(bk);
    double *sq = &ctx->clip.part_sq[ctx->clip.part0[op->index]];
    for (int k = 0; k < nparts; k++) {
        size_t len;
        const char *p = dear_bucket_own(&ctx->cm, bk, k, &len);
        sq[k] = 0;
        if (len > 0 && mo->sumsq(dear_rt_work_queue(ctx), bk->dtype, p, len, &sq[k]) != DEAR_OK)
            ctx->clip.failed = 1;
    }
}

/* Queued behind the reduce-scatters: the squares are written once the buffers' queue has run
 * them. */
static int norm_prepare(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    DEAR_CHECK(mo->fence_record(ctx->clip.sq_fence, dear_rt_work_queue(ctx)));
    op->pt.start_fence = ctx->clip.sq_fence;
    return DEAR_OK;
}

static void norm_before(dear_ctx_t *ctx, dear_op_t *op)
{
    if (ctx->clip.xs) { /* the words travel; the next iteration's squares start from zero */
        dear_xsum_export(ctx->clip.xs, ctx->clip.words);
        dear_xsum_init(ctx->clip.xs);
        return;
    }
    double s = 0;
    for (int b = 0; b < ctx->graph.nbuckets; b++) { /* bucket order: the same sum on every rank */
        double sb = 0;
        for (int k = ctx->clip.part0[b]; k < ctx->clip.part0[b + 1]; k++)
            sb += ctx->clip.part_sq[k];
        s += sb;
    }
    ctx->clip.sum = s;
}

/* Every shard scaled on the buffers' queue, ahead of the all-gathers that read them (sharded
 * updates: ahead of the updates, the slices then put in the gradients). */
static int norm_finish(dear_ctx_t *ctx, dear_op_t *op)
{
    if (ctx->clip.failed) {
        DEAR_ERROR("clip", "the squared norm of a shard could not be taken (above)");
        return DEAR_ERR_INTERNAL;
    }
    set_result(ctx, ctx->clip.xs ? dear_xsum_value(ctx->clip.words) : ctx->clip.sum, op->sh.iter);
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        for (int k = 0; k < dear_bucket_parts(bk) && ctx->clip.coef != 1; k++) {
            size_t len;
            char *p = dear_bucket_own(&ctx->cm, bk, k, &len);
            if (len > 0)
                DEAR_CHECK(mo->scale(dear_rt_work_queue(ctx), bk->dtype, p, p, len, ctx->clip.coef));
        }
        if (dear_shard_on(ctx))
            DEAR_CHECK(dear_rt_shard_unpack(ctx, bk));
    }
    return DEAR_OK;
}

/* The squares' room and fence; under a split schedule the norm's collective, a barrier of the
 * graph after every reduce-scatter, and the squares taken after each. */
static int clip_graph(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    dear_op_t *op = &ctx->clip.op; /* its deps, parts and fence were freed with the last graph */
    memset(op, 0, sizeof *op);
    ctx->clip.failed = 0;
    size_t nb = (size_t)ctx->graph.nbuckets;
    DEAR_ALLOC_GOTO(ctx->clip.part0, calloc(nb + 1, sizeof(int)), (nb + 1) * sizeof(int), rc, out);
    for (int b = 0; b < ctx->graph.nbuckets; b++)
        ctx->clip.part0[b + 1] = ctx->clip.part0[b] + dear_bucket_parts(&ctx->graph.buckets[b]);
    /* Room for a square per part (dear) or per tensor (dear_clip_averaged). */
    size_t np = (size_t)ctx->clip.part0[nb] > (size_t)ctx->reg.ntensors ? (size_t)ctx->clip.part0[nb]
                                                                         : (size_t)ctx->reg.ntensors;
    /* Host memory the gradients' row can write a square into from its queue (pinned for a GPU). */
    DEAR_CHECK_GOTO(ctx->mem.ops->alloc((np + 1) * sizeof(double), 1, (void **)&ctx->clip.part_sq), rc, out);
    DEAR_CHECK_GOTO(dear_rt_fence_new(ctx, &ctx->clip.sq_fence), rc, out);
    if (dear_determ_on(ctx)) {
        /* The squares are read on the host: the mode runs every bucket on host memory. */
        if (dear_rt_work_queue(ctx) != NULL || !(dear_rt_work_ops(ctx)->flags & DEAR_MEM_F_HOST_ACCESS)) {
            DEAR_ERROR("clip", "DEAR_DETERMINISTIC=1: the buckets are not in host memory (%s)", ctx->mem.ops->name);
            rc = DEAR_ERR_INTERNAL;
            goto out;
        }
        DEAR_ALLOC_GOTO(ctx->clip.xs, calloc(1, sizeof *ctx->clip.xs), sizeof *ctx->clip.xs, rc, out);
        DEAR_ALLOC_GOTO(ctx->clip.words, calloc(DEAR_XSUM_WORDS, sizeof(double)), DEAR_XSUM_WORDS * sizeof(double),
                        rc, out);
    }
    if (!dear_rt_split(ctx))
        goto out; /* wfbp, sync: the norm of the averaged gradients at backward_end */
    DEAR_ALLOC_GOTO(op->deps, calloc(nb, sizeof *op->deps), nb * sizeof *op->deps, rc, out);
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        op->deps[b] = &ctx->graph.buckets[b].op;
        DEAR_CHECK_GOTO(dear_op_hook(&ctx->graph.buckets[b].op, NULL, shard_sq), rc, out);
    }
    op->ndeps = ctx->graph.nbuckets;
    if (ctx->clip.xs)
        dear_op_sum(ctx, op, 0, -1, DEAR_FLOAT64, ctx->clip.words, DEAR_XSUM_WORDS);
    else
        dear_op_sum(ctx, op, 0, -1, DEAR_FLOAT64, &ctx->clip.sum, 1);
    op->prepare = norm_prepare;
    DEAR_CHECK_GOTO(dear_op_hook(op, norm_before, NULL), rc, out);
    op->finish = norm_finish;
    dear_graph_barrier(ctx, op);
out:
    return rc;
}

static void clip_graph_free(dear_ctx_t *ctx)
{
    free(ctx->clip.op.deps);
    free(ctx->clip.part0);
    free(ctx->clip.xs);
    free(ctx->clip.words);
    ctx->clip.xs = NULL;
    ctx->clip.words = NULL;
    if (ctx->clip.part_sq)
        ctx->mem.ops->release(ctx->clip.part_sq, 1);
    dear_rt_fence_free(ctx, ctx->clip.sq_fence);
    ctx->clip.op.deps = NULL;
    ctx->clip.part0 = NULL;
    ctx->clip.part_sq = NULL;
    ctx->clip.sq_fence = NULL;
}

int dear_clip_averaged(dear_ctx_t *ctx)
{
    const dear_mem_ops_t *mo = ctx->mem.ops;
    double *sq = ctx->clip.part_sq;
    if (ctx->clip.xs) {
        /* The same exact sum as the shards', read where the collectives left the averages: the
         * buckets' host buffers (staged memory) or the gradients themselves (host memory). */
        for (int u = 0; u < ctx->graph.nunits; u++)
            add_squares(ctx->clip.xs, ctx->reg.tensors[ctx->graph.units[u].tensor].dtype, dear_unit_vec(ctx, u, 0),
                        dear_unit_ccount(&ctx->graph, &ctx->reg, u));
        dear_xsum_export(ctx->clip.xs, ctx->clip.words);
        dear_xsum_init(ctx->clip.xs);
        set_result(ctx, dear_xsum_value(ctx->clip.words), ctx->it.iter);
        goto scale;
    }
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        const dear_tensor_t *tt = &ctx->reg.tensors[t];
        sq[t] = 0;
        if (!tt->frozen)
            DEAR_CHECK(mo->sumsq(ctx->mem.app, tt->dtype, tt->grad, tt->count, &sq[t]));
    }
    /* The squares are read here: the application's thread waits for them. */
    DEAR_CHECK(mo->fence_record(ctx->clip.sq_fence, ctx->mem.app));
    DEAR_CHECK(mo->fence_wait(NULL, ctx->clip.sq_fence));
    double s = 0;
    for (int t = 0; t < ctx->reg.ntensors; t++) /* tensor order: the same sum on every rank */
        s += sq[t];
    set_result(ctx, s, ctx->it.iter);
scale:
    for (int t = 0; ctx->clip.coef != 1 && t < ctx->reg.ntensors; t++) {
        const dear_tensor_t *tt = &ctx->reg.tensors[t];
        if (!tt->frozen)
            DEAR_CHECK(mo->scale(ctx->mem.app, tt->dtype, tt->grad, tt->grad, tt->count, ctx->clip.coef));
    }
    return DEAR_OK;
}

const dear_feature_t dear_feature_clip = {
    .after = DEAR_FEAT_BIT(SHARD) | DEAR_FEAT_BIT(DETERMINISTIC),
    .decide = clip_decide,
    .on = dear_clip_on,
    .graph = clip_graph,
    .graph_free = clip_graph_free,
};

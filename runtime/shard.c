/*
 * Sharded updates: ZeRO's optimizer-state sharding inside DeAR's schedule. Every unit of the plan
 * (a tensor, or a chunk of a cut one) is a vector of its own over every rank in the
 * reduce-scatters and all-gathers (buckets.c), so rank r owns slice r of each unit by the shard
 * rule whatever the plan, and optimizer state kept for a rank's slices stays valid across plan
 * switches and freezing. Each of this rank's slices is updated on the application thread once its
 * bucket's reduce-scatter is done: under `dear` (DEAR_SHARD_EARLY) at the first backward hook that
 * finds it done, so that the plan's early all-gathers may carry its parameters during backward;
 * the rest at backward_end, waited for bucket by bucket (the updates of one run while later ones
 * still travel). The all-gathers then carry the updated parameters into every rank's parameter
 * buffers: during the next forward pass under `dear`, before backward_end returns under `wfbp`
 * and `sync`. A barrier over every reduce-scatter (clipping's norm, the count of ranks with a
 * gradient) comes before any update, so with one every slice waits for backward_end.
 * DEAR_SHARD_HOLD leaves the all-gathers held until dear_shard_release (or the next hook), for a
 * program that steps its slices itself after backward_end; a plan switch due at that backward_end
 * waits for them.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/check.h"
#include "base/mpi_check.h"
#include "base/params.h"
#include "base/util.h"
#include "runtime/rt.h"

int dear_shard_on(const dear_ctx_t *ctx) { return ctx->shard.on; }

int dear_shard_holds(const dear_ctx_t *ctx) { return ctx->shard.hold; }

int dear_shard_held(const dear_ctx_t *ctx) { return ctx->shard.held; }

/* An early group's last bucket to complete holds its first unit (buckets.c's order); the others
 * follow every update of the iteration. */
dear_fence_t *dear_shard_updated(const dear_ctx_t *ctx, int g)
{
    const dear_group_t *gr = &ctx->graph.groups[g];
    int b = ctx->graph.units[gr->u0].bucket;
    return gr->early && b < ctx->shard.nstepped ? ctx->shard.stepped[b] : ctx->shard.updated;
}

int dear_shard_steps_early(const dear_ctx_t *ctx)
{
    return ctx->shard.early && !dear_clip_on(ctx) && !dear_unused_on(ctx);
}

int dear_rt_split(const dear_ctx_t *ctx)
{
    return ctx->shard.on || (dear_sched_flags(ctx->cfg.sched) & DEAR_SCHED_F_SPLIT) != 0;
}

static int set_shard_claimed(dear_ctx_t *ctx, int flags)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_set_shard: ctx is NULL");
    DEAR_ARG_CHECK(flags == 0 || flags == DEAR_SHARD_ON || flags == (DEAR_SHARD_ON | DEAR_SHARD_HOLD),
                   "dear_set_shard: flags %d; accepted: 0 (off), DEAR_SHARD_ON (%d), DEAR_SHARD_ON | DEAR_SHARD_HOLD "
                   "(%d)",
                   flags, DEAR_SHARD_ON, DEAR_SHARD_ON | DEAR_SHARD_HOLD);
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_set_shard(%d): the context is already committed; choose sharded updates before "
                          "dear_commit (the all-gathers' vectors are built there)",
                   flags);
        return DEAR_ERR_STATE;
    }
    ctx->shard.flags = flags;
    return DEAR_OK;
}

int dear_set_shard(dear_ctx_t *ctx, int flags)
{
    DEAR_CLAIMED(ctx, "dear_set_shard", set_shard_claimed(ctx, flags));
}

/* This rank's reason to refuse sharded updates, logged, or DEAR_OK. */
static int shard_refusal(const dear_ctx_t *ctx)
{
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        const dear_tensor_t *tt = &ctx->reg.tensors[t];
        if (tt->param == NULL) {
            DEAR_ERROR("api", "dear_commit: sharded updates (DEAR_SHARD, dear_set_shard) need every tensor's "
                              "parameters, which the all-gathers carry, and tensor '%s' has none: call "
                              "dear_set_param for each tensor (and update only the slice the callback is given: "
                              "info->offset, info->count), or unset DEAR_SHARD",
                       tt->name);
            return DEAR_ERR_ARG;
        }
    }
    return DEAR_OK;
}

/* Rank 0's DEAR_SHARD, or the program's flags, the same on every rank; the parameters given. */
static int shard_decide(dear_ctx_t *ctx)
{
    /* Rank 0's DEAR_SHARD holds; the program's flags must agree everywhere. */
    int env = (int)dear_param_int(DEAR_P_SHARD), f[2] = { ctx->shard.flags, -ctx->shard.flags }, both[2];
    DEAR_MPI_CHECK(MPI_Bcast(&env, 1, MPI_INT, 0, ctx->cm.comm));
    DEAR_MPI_CHECK(MPI_Allreduce(f, both, 2, MPI_INT, MPI_MAX, ctx->cm.comm));
    if (both[0] != -both[1]) {
        DEAR_ERROR("api", "dear_commit: dear_set_shard(%d) on this rank, but not the same on every rank; sharded "
                          "updates are collective",
                   ctx->shard.flags);
        return DEAR_ERR_MISMATCH;
    }
    ctx->shard.on = env || (ctx->shard.flags & DEAR_SHARD_ON);
    ctx->shard.hold = ctx->shard.on && (ctx->shard.flags & DEAR_SHARD_HOLD);
    ctx->shard.held = ctx->shard.switch_due = 0;
    /* Rank 0's DEAR_SHARD_EARLY; the program that steps held slices itself is never early. */
    int early = (int)dear_param_int(DEAR_P_SHARD_EARLY);
    DEAR_MPI_CHECK(MPI_Bcast(&early, 1, MPI_INT, 0, ctx->cm.comm));
    ctx->shard.early = ctx->shard.on && !ctx->shard.hold && early && ctx->cfg.sched == DEAR_SCHED_DEAR;
    ctx->shard.step_iter = -1;
    if (!ctx->shard.on)
        return DEAR_OK;
    /* Every rank leaves with the same verdict: a rank without parameters fails them all. */
    int mine = shard_refusal(ctx), worst = 0;
    DEAR_MPI_CHECK(MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MIN, ctx->cm.comm));
    if (worst != DEAR_OK) {
        if (mine == DEAR_OK)
            DEAR_ERROR("api", "dear_commit: another rank refused sharded updates (%s); see its message",
                       dear_status_string(worst));
        ctx->shard.on = ctx->shard.hold = 0;
        return mine != DEAR_OK ? mine : worst;
    }
    DEAR_INFO("api", "sharded updates: each rank updates its slice of every tensor, the all-gathers carry "
                     "parameters%s",
              ctx->shard.hold ? " (held for dear_shard_release)"
              : ctx->shard.early ? " (slices stepped during backward where no clipping or DEAR_FIND_UNUSED)"
                                 : "");
    return DEAR_OK;
}

int dear_shard_slices(const dear_ctx_t *ctx, int rank, dear_slice_t *slices, int max)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_shard_slices: ctx is NULL");
    if (!ctx->committed || !ctx->shard.on) {
        DEAR_ERROR("api", "dear_shard_slices: %s", !ctx->committed ? "the context is not committed; the slices are "
                                                                      "fixed by dear_commit"
                                                                    : "sharded updates are off (dear_set_shard, "
                                                                      "DEAR_SHARD)");
        return DEAR_ERR_STATE;
    }
    DEAR_ARG_CHECK(rank >= 0 && rank < ctx->cm.size, "dear_shard_slices: rank %d; accepted: 0..%d", rank,
                   ctx->cm.size - 1);
    DEAR_ARG_CHECK(max >= 0 && (max == 0 || slices != NULL), "dear_shard_slices: %s",
                   max < 0 ? "max is negative" : "slices is NULL with max > 0");
    int n = 0;
    size_t pos = 0;
    for (int u = 0; u < ctx->graph.nunits; u++) {
        const dear_rt_unit_t *un = &ctx->graph.units[u];
        size_t off, len;
        dear_coll_shard(un->count, ctx->cm.size, rank, &off, &len);
        if (len == 0)
            continue;
        if (n < max)
            slices[n] = (dear_slice_t){ .tensor = un->tensor, .offset = un->eoff + off, .count = len,
                                        .shard_offset = pos };
        n++;
        pos += len;
    }
    return n;
}

/* The next bucket of this iteration, in backward order, whose slices are not stepped yet (-1:
 * none); a new iteration, or a new plan, starts from the last bucket. */
static int step_next(dear_ctx_t *ctx)
{
    if (ctx->shard.step_iter != ctx->it.iter) {
        ctx->shard.step_iter = ctx->it.iter;
        ctx->shard.step_next = ctx->graph.nbuckets - 1;
    }
    return ctx->shard.step_next;
}

/* Bucket b's reduce-scatter of this iteration is done and its slices are in the gradients: the
 * updates of this rank's slices of its units, then its early all-gather groups, which send them. */
static int bucket_updates(dear_ctx_t *ctx, int bi, long long iter)
{
    int rc = DEAR_OK;
    dear_bucket_t *b = &ctx->graph.buckets[bi];
    DEAR_CHECK(dear_engine_wait(ctx, &b->op, iter));
    DEAR_CHECK(dear_rt_wait_done(ctx, b->done));
    ctx->shard.step_next = bi - 1;
    for (int u = b->u0; u < b->u1; u++) {
        const dear_rt_unit_t *un = &ctx->graph.units[u];
        if (un->own_len == 0 || dear_unit_ccount(&ctx->graph, &ctx->reg, u) == 0 ||
            !dear_tensor_updates(ctx, un->tensor))
            continue;
        int r = dear_call_update_slice(ctx, u, iter);
        if (r != DEAR_OK && rc == DEAR_OK)
            rc = r;
    }
    if (b->early_lo > b->early_hi)
        return rc;
    /* The groups send what the updates wrote on the application's queue. */
    DEAR_CHECK(ctx->mem.ops->fence_record(ctx->shard.stepped[bi], ctx->mem.app));
    for (int g = b->early_hi; g >= b->early_lo; g--) {
        if (!ctx->graph.groups[g].early)
            continue;
        ctx->graph.groups[g].unpacked = 0;
        dear_engine_queue(ctx, &ctx->graph.groups[g].op);
    }
    return rc;
}

int dear_shard_step_ready(dear_ctx_t *ctx)
{
    if (!dear_shard_steps_early(ctx))
        return DEAR_OK;
    int rc = DEAR_OK;
    long long iter = ctx->it.iter;
    double t0 = dear_now();
    int b0 = step_next(ctx);
    for (int b = b0; b >= 0; b = ctx->shard.step_next) {
        int done = dear_engine_done(ctx, &ctx->graph.buckets[b].op, iter);
        if (done)
            DEAR_CHECK(dear_rt_done_query(ctx, ctx->graph.buckets[b].done, &done));
        if (!done)
            break; /* never a wait in a hook: a later hook, or backward_end, steps it */
        int r = bucket_updates(ctx, b, iter);
        if (r == DEAR_ERR_CALLBACK && rc == DEAR_OK)
            rc = r; /* the other ranks still gather: this one must too */
        else if (r != DEAR_OK)
            return r;
    }
    if (ctx->tl && ctx->shard.step_next != b0)
        dear_timeline_span(ctx->tl, "sharded updates", "compute", DEAR_LANE_COMPUTE, t0, dear_now(), NULL);
    return rc;
}

int dear_shard_backward_end(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    long long iter = ctx->it.iter;
    if (ctx->cfg.sched == DEAR_SCHED_SYNC) /* no overlap: every reduce-scatter after backward */
        for (int b = ctx->graph.nbuckets - 1; b >= 0; b--)
            dear_engine_queue(ctx, &ctx->graph.buckets[b].op);
    dear_graph_queue_barriers(ctx);
    double t0 = dear_now();
    /* The barriers (the count of ranks with a gradient, the norm) follow every reduce-scatter, and
     * each update needs them; without them a bucket's updates run as soon as it is reduced, in
     * the order backward completed the buckets. */
    DEAR_CHECK(dear_graph_wait_barriers(ctx, iter));
    for (int b = step_next(ctx); b >= 0; b = ctx->shard.step_next) {
        int r = bucket_updates(ctx, b, iter);
        if (r == DEAR_ERR_CALLBACK && rc == DEAR_OK)
            rc = r; /* the other ranks still gather: this one must too */
        else if (r != DEAR_OK)
            return r;
    }
    if (ctx->tl)
        dear_timeline_span(ctx->tl, "sharded updates", "compute", DEAR_LANE_COMPUTE, t0, dear_now(), NULL);
    /* The all-gathers send what the updates wrote on the application's queue. */
    DEAR_CHECK(ctx->mem.ops->fence_record(ctx->shard.updated, ctx->mem.app));
    ctx->shard.held = 1;
    return rc;
}

int dear_shard_release_held(dear_ctx_t *ctx, const char *call)
{
    if (!ctx->shard.held)
        return DEAR_OK;
    ctx->shard.held = 0;
    long long iter = ctx->it.iter - 1; /* the iteration whose gradients the updates used */
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        if (ctx->graph.groups[g].early)
            continue; /* queued behind their buckets' updates */
        ctx->graph.groups[g].unpacked = 0;
        dear_engine_queue_at(ctx, &ctx->graph.groups[g].op, iter);
    }
    ctx->it.npending = 0;
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        ctx->reg.tensors[t].pending = !ctx->reg.tensors[t].frozen;
        ctx->it.npending += ctx->reg.tensors[t].pending;
    }
    if (!(dear_sched_flags(ctx->cfg.sched) & DEAR_SCHED_F_SPLIT)) {
        /* wfbp, sync: nothing is pending between iterations. */
        for (int g = 0; g < ctx->graph.ngroups; g++)
            DEAR_CHECK(dear_group_ready(ctx, g, call, -1));
        for (int t = 0; t < ctx->reg.ntensors; t++)
            ctx->reg.tensors[t].pending = 0;
        ctx->it.npending = 0;
    }
    int due = ctx->shard.switch_due;
    ctx->shard.switch_due = 0;
    return due ? dear_switch_plan(ctx, (dear_switch_t)(due - 1)) : DEAR_OK;
}

int dear_shard_defer_switch(dear_ctx_t *ctx, dear_switch_t kind)
{
    if (!ctx->shard.held)
        return 0;
    ctx->shard.switch_due = (int)kind + 1;
    return 1;
}

/* The fences the all-gathers wait on for the updates (mem.c's prepare of each all-gather): one
 * after every update, and one per bucket for the early groups. */
static int shard_graph(dear_ctx_t *ctx)
{
    ctx->shard.step_iter = -1; /* a new plan's buckets */
    DEAR_CHECK(dear_rt_fence_new(ctx, &ctx->shard.updated));
    if (ctx->graph.ngroups_early == 0)
        return DEAR_OK;
    size_t n = (size_t)ctx->graph.nbuckets;
    DEAR_ALLOC_CHECK(ctx->shard.stepped, calloc(n, sizeof *ctx->shard.stepped), sizeof *ctx->shard.stepped * n);
    ctx->shard.nstepped = ctx->graph.nbuckets;
    for (int b = 0; b < ctx->graph.nbuckets; b++)
        DEAR_CHECK(dear_rt_fence_new(ctx, &ctx->shard.stepped[b]));
    return DEAR_OK;
}

static void shard_graph_free(dear_ctx_t *ctx)
{
    dear_rt_fence_free(ctx, ctx->shard.updated);
    ctx->shard.updated = NULL;
    for (int b = 0; b < ctx->shard.nstepped; b++)
        dear_rt_fence_free(ctx, ctx->shard.stepped[b]);
    free(ctx->shard.stepped);
    ctx->shard.stepped = NULL;
    ctx->shard.nstepped = 0;
}

static const dear_feature_rule_t shard_rules[] = {
    { DEAR_RULE_REFUSES, DEAR_FEAT_CUDA, DEAR_WHEN_ALWAYS,
      "the all-gathers of parameters run on host memory only; train unsharded on GPUs (unset DEAR_SHARD, no "
      "dear_set_shard)" },
    { DEAR_RULE_END, 0, 0, NULL },
};

const dear_feature_t dear_feature_shard = {
    .rules = shard_rules,
    .decide = shard_decide,
    .on = dear_shard_on,
    .graph = shard_graph,
    .graph_free = shard_graph_free,
};

/*
 * Tensors without a gradient. dear_freeze takes a tensor out of communication and updates for
 * good: it stays in the plan (plans and profiles describe the model) but its bucket's vector
 * skips it, and a collective left with nothing to move completes at once, so a frozen tensor
 * costs no bytes and no message. dear_no_grad marks one iteration without a gradient on this
 * rank: the library writes the zeros the rank contributes, and with DEAR_FIND_UNUSED one small
 * collective per iteration counts the ranks that had a gradient, so that an update with none
 * anywhere is skipped (a stateful optimiser such as Adam would otherwise still move the weights).
 * The zeros still travel: buckets have a fixed shape on every rank.
 */
#include <stdlib.h>
#include <string.h>

#include "base/mpi_check.h"
#include "base/params.h"
#include "runtime/rt.h"

int dear_tensor_index(const dear_ctx_t *ctx, const char *name)
{
    DEAR_ARG_CHECK(ctx != NULL && name != NULL, "dear_tensor_index: %s is NULL", ctx ? "name" : "ctx");
    for (int i = 0; i < ctx->reg.ntensors; i++)
        if (strcmp(ctx->reg.tensors[i].name, name) == 0)
            return i;
    DEAR_ERROR("api", "dear_tensor_index('%s'): no tensor of that name is registered", name);
    return DEAR_ERR_ARG;
}

static int tensor_arg(const dear_ctx_t *ctx, const char *call, int tensor)
{
    DEAR_ARG_CHECK(ctx != NULL, "%s: ctx is NULL", call);
    DEAR_ARG_CHECK(tensor >= 0 && tensor < ctx->reg.ntensors,
                   "%s(tensor %d): no such tensor; registered tensors are 0..%d in registration order", call, tensor,
                   ctx->reg.ntensors - 1);
    return DEAR_OK;
}

static int no_grad_claimed(dear_ctx_t *ctx, int tensor)
{
    DEAR_CHECK(tensor_arg(ctx, "dear_no_grad", tensor));
    dear_tensor_t *t = &ctx->reg.tensors[tensor];
    if (!ctx->committed || ctx->it.mode == DEAR_MODE_EVAL ||
        (ctx->it.in_backward && t->lidx >= 0 && ctx->reg.layers[t->lidx].bwd_iter == ctx->it.iter)) {
        DEAR_ERROR("api", "dear_no_grad('%s'): call it during an iteration, before dear_backward_done of its layer %d "
                          "(the gradient is communicated then)",
                   t->name, t->layer);
        return DEAR_ERR_STATE;
    }
    DEAR_CHECK(dear_rt_zero(ctx, t->grad, t->bytes)); /* what this rank contributes; +0.0 in every type */
    t->nograd_iter = ctx->it.iter;
    return DEAR_OK;
}

int dear_no_grad(dear_ctx_t *ctx, int tensor)
{
    DEAR_CLAIMED(ctx, "dear_no_grad", no_grad_claimed(ctx, tensor));
}

int dear_tensor_updates(const dear_ctx_t *ctx, int t)
{
    const dear_tensor_t *tt = &ctx->reg.tensors[t];
    return !tt->frozen && !(ctx->unused.on && tt->live_ranks == 0);
}

/* ---- the count of ranks with a gradient ---- */

static void live_before(dear_ctx_t *ctx, dear_op_t *op)
{
    for (int t = 0; t < ctx->reg.ntensors; t++)
        ctx->unused.live[t] = ctx->reg.tensors[t].nograd_iter == op->sh.iter ? 0 : 1;
}

static void live_after(dear_ctx_t *ctx, dear_op_t *op)
{
    for (int t = 0; t < ctx->reg.ntensors; t++)
        ctx->reg.tensors[t].live_ranks = ctx->unused.live[t];
}

/* The count of ranks with a gradient: a barrier of the graph, after every reduce-scatter. */
static int unused_graph(dear_ctx_t *ctx)
{
    int rc = DEAR_OK, n = ctx->reg.ntensors;
    dear_op_t *op = &ctx->unused.op;
    free(ctx->unused.live);
    memset(op, 0, sizeof *op);
    DEAR_ALLOC_GOTO(ctx->unused.live, calloc((size_t)n, sizeof *ctx->unused.live), sizeof(int32_t) * (size_t)n, rc,
                    out);
    dear_op_sum(ctx, op, 0, -2, DEAR_INT32, ctx->unused.live, (size_t)n);
    DEAR_CHECK_GOTO(dear_op_hook(op, live_before, live_after), rc, out);
    dear_graph_barrier(ctx, op);
out:
    return rc;
}

static void unused_graph_free(dear_ctx_t *ctx)
{
    free(ctx->unused.live);
    ctx->unused.live = NULL;
}

/* Rank 0's DEAR_FIND_UNUSED decides: its collective must be in every rank's plan. */
static int unused_decide(dear_ctx_t *ctx)
{
    ctx->unused.on = (int)dear_param_int(DEAR_P_FIND_UNUSED);
    DEAR_MPI_CHECK(MPI_Bcast(&ctx->unused.on, 1, MPI_INT, 0, ctx->cm.comm));
    return DEAR_OK;
}

int dear_unused_on(const dear_ctx_t *ctx) { return ctx->unused.on; }

const dear_feature_t dear_feature_unused = {
    .decide = unused_decide,
    .on = dear_unused_on,
    .graph = unused_graph,
    .graph_free = unused_graph_free,
    .free = unused_graph_free,
};

/* ---- freezing ---- */

static int freeze_claimed(dear_ctx_t *ctx, int tensor, int frozen)
{
    DEAR_CHECK(tensor_arg(ctx, "dear_freeze", tensor));
    dear_tensor_t *t = &ctx->reg.tensors[tensor];
    frozen = frozen != 0;
    if (!ctx->committed) {
        t->frozen = frozen; /* dear_commit checks every rank froze the same tensors */
        return DEAR_OK;
    }
    if (ctx->it.in_backward || ctx->it.mode != DEAR_MODE_TRAIN) {
        DEAR_ERROR("api", "dear_freeze('%s'): call it between training iterations (not during a backward pass, "
                          "nor in accumulation or evaluation mode)",
                   t->name);
        return DEAR_ERR_STATE;
    }
    /* Collective, like a plan switch: nothing pending, the same change on every rank, then the
     * buckets are rebuilt without (or with) the tensor. */
    int rc = dear_sched_flush(ctx, "dear_freeze");
    int mine[2] = { rc == DEAR_OK ? tensor * 2 + frozen : -1, 0 }, lo = 0, hi = 0;
    mine[1] = mine[0];
    DEAR_MPI_CHECK(MPI_Allreduce(&mine[0], &lo, 1, MPI_INT, MPI_MIN, ctx->cm.comm));
    DEAR_MPI_CHECK(MPI_Allreduce(&mine[1], &hi, 1, MPI_INT, MPI_MAX, ctx->cm.comm));
    if (lo != hi) {
        if (rc == DEAR_OK)
            DEAR_ERROR("api", "dear_freeze('%s', %d): the ranks did not all make this call (or one failed to flush); "
                              "call dear_freeze with the same arguments on every rank",
                       t->name, frozen);
        return rc != DEAR_OK ? rc : DEAR_ERR_MISMATCH;
    }
    if (t->frozen == frozen)
        return DEAR_OK;
    dear_engine_stop(ctx);
    ctx->eng.sh.stop = 0;
    t->frozen = frozen;
    dear_plan_t plan = { 0 };
    rc = dear_plan_copy(&plan, &ctx->graph.plan);
    if (rc == DEAR_OK)
        rc = dear_graph_rebuild(ctx, &plan);
    dear_plan_free(&plan);
    return dear_planning_restart(ctx, rc);
}

int dear_freeze(dear_ctx_t *ctx, int tensor, int frozen)
{
    DEAR_CLAIMED(ctx, "dear_freeze", freeze_claimed(ctx, tensor, frozen));
}

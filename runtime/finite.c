/*
 * Which rank made the NaN (DEAR_CHECK_FINITE=off|warn|abort). One rank's NaN or Inf becomes NaN
 * on every rank after the reduce-scatter, and then nobody can tell where it came from. So, right
 * before each bucket's reduce-scatter (all-reduce), on the progress thread, this rank's own
 * contribution is checked, unit by unit. The report names the rank, the tensor, its elements,
 * the iteration and the count of non-finite values; `abort` then stops every rank (MPI_Abort)
 * with it. Nothing is changed: the NaN still travels, so GradScaler's "skip this step" still
 * happens on every rank.
 *
 * Where the host reads the buckets (host memory, staged CUDA memory) the elements whose exponent
 * bits say NaN or Inf are counted at once, as fast as the reads. On memory only a device reaches
 * (CUDA under NCCL) the memory row's squared-norm kernel runs behind the packing on the
 * communication stream, and a NaN or Inf makes the squares non-finite; the progress thread never
 * waits for the GPU, so they are read once done, at a later reduce-scatter of the bucket (or when
 * the graph goes), and the count is not known there (only that it is not 0). Each bucket has
 * DEAR_FINITE_SLOTS slots for squares still queued; with all of them queued (the GPU that many
 * iterations behind) a reduce-scatter goes unchecked, and the graph's end says how many.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/mpi_check.h"
#include "base/params.h"
#include "collectives/reduce.h"
#include "runtime/rt.h"

/* DEAR_CHECK_FINITE's choices, in the table's order. */
enum { FINITE_OFF, FINITE_WARN, FINITE_ABORT };
/* Reports at most this many iterations in warn mode; then one line says the rest are counted. */
#define MAX_REPORTS 20

int dear_finite_on(const dear_ctx_t *ctx) { return ctx->finite.mode != FINITE_OFF; }

static int finite_decide(dear_ctx_t *ctx)
{
    ctx->finite.mode = (int)dear_param_enum(DEAR_P_CHECK_FINITE);
    DEAR_MPI_CHECK(MPI_Bcast(&ctx->finite.mode, 1, MPI_INT, 0, ctx->cm.comm));
    ctx->finite.reports = 0;
    return DEAR_OK;
}

/* The units of bucket b with non-finite values: on the host counted here (sq NULL), on a device
 * those whose squares (sq, per unit from the bucket's first) are not finite. Report them; then
 * abort, or go on. */
static void judge(dear_ctx_t *ctx, int b, const double *sq, long long iter)
{
    const dear_bucket_t *bk = &ctx->graph.buckets[b];
    int nbad = 0, host = sq == NULL;
    for (int u = bk->u0; u < bk->u1; u++) {
        if (!host && isfinite(sq[u - bk->u0]))
            continue;
        const dear_rt_unit_t *un = &ctx->graph.units[u];
        const dear_tensor_t *tt = &ctx->reg.tensors[un->tensor];
        size_t n = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
        size_t bad = host ? dear_reduce_nonfinite(tt->dtype, dear_unit_vec(ctx, u, 0), n) : 0;
        if (host && bad == 0)
            continue;
        nbad++;
        if (ctx->finite.mode == FINITE_WARN && ctx->finite.reports >= MAX_REPORTS)
            continue;
        char count[48];
        if (host)
            snprintf(count, sizeof count, "%zu non-finite value%s", bad, bad == 1 ? "" : "s");
        else
            snprintf(count, sizeof count, "non-finite values");
        if (ctx->finite.mode == FINITE_ABORT)
            DEAR_ERROR("finite", "rank %d: the gradient of tensor '%s' (layer %d, elements %zu..%zu) has %s in "
                                 "iteration %lld, before its reduce-scatter: this rank made them; aborting every rank "
                                 "(DEAR_CHECK_FINITE=abort)",
                       ctx->cm.rank, tt->name, tt->layer, un->eoff, un->eoff + n, count, iter);
        else
            DEAR_WARN("finite", "rank %d: the gradient of tensor '%s' (layer %d, elements %zu..%zu) has %s in "
                                "iteration %lld, before its reduce-scatter: this rank made them (every rank will see "
                                "NaN after the sum)",
                      ctx->cm.rank, tt->name, tt->layer, un->eoff, un->eoff + n, count, iter);
    }
    if (nbad == 0)
        return;
    if (ctx->finite.mode == FINITE_ABORT)
        MPI_Abort(ctx->cm.comm, 3);
    if (++ctx->finite.reports == MAX_REPORTS)
        DEAR_WARN("finite", "rank %d: %d iterations with non-finite gradients reported; further ones are not",
                  ctx->cm.rank, MAX_REPORTS);
}

/* Squares of bucket b still on a device queue: each slot judged once its fence says they are
 * written (wait: the graph's end, the queue quiesced). */
static void judge_pending(dear_ctx_t *ctx, int b, int wait)
{
    dear_finite_bucket_t *fb = &ctx->finite.b[b];
    const dear_bucket_t *bk = &ctx->graph.buckets[b];
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    for (int s = 0; s < DEAR_FINITE_SLOTS; s++) {
        int done = 0;
        if (fb->iter[s] < 0)
            continue;
        if (wait)
            done = mo->fence_wait(NULL, fb->fence[s]) == DEAR_OK;
        else if (mo->fence_query(fb->fence[s], &done) != DEAR_OK)
            done = 0;
        if (done) {
            judge(ctx, b, fb->sq + (size_t)s * (size_t)(bk->u1 - bk->u0), fb->iter[s]);
            fb->iter[s] = -1;
        }
    }
}

/* Right before the bucket's reduce-scatter (all-reduce): this rank's contribution, unit by unit. */
static void finite_before(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_bucket_t *bk = &ctx->graph.buckets[op->index];
    dear_finite_bucket_t *fb = &ctx->finite.b[op->index];
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    dear_memq_t *q = dear_rt_work_queue(ctx);
    if (q == NULL) { /* the host reads the buckets: counted there at once */
        judge(ctx, op->index, NULL, op->sh.iter);
        return;
    }
    int s = 0; /* earlier squares first, then a free slot: the progress thread never waits */
    judge_pending(ctx, op->index, 0);
    while (s < DEAR_FINITE_SLOTS && fb->iter[s] >= 0)
        s++;
    if (s == DEAR_FINITE_SLOTS) {
        ctx->finite.unchecked++;
        return;
    }
    double *sq = fb->sq + (size_t)s * (size_t)(bk->u1 - bk->u0);
    for (int u = bk->u0; u < bk->u1; u++) {
        size_t n = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
        sq[u - bk->u0] = 0;
        if (n > 0 && mo->sumsq(q, bk->dtype, dear_unit_vec(ctx, u, 0), n, &sq[u - bk->u0]) != DEAR_OK)
            sq[u - bk->u0] = 0; /* the row logged it; the collective reports its own failure */
    }
    if (mo->fence_record(fb->fence[s], q) == DEAR_OK)
        fb->iter[s] = op->sh.iter;
}

static void finite_graph_free(dear_ctx_t *ctx)
{
    for (int b = 0; ctx->finite.b && b < ctx->finite.nb; b++) {
        dear_finite_bucket_t *fb = &ctx->finite.b[b];
        if (ctx->graph.buckets)
            judge_pending(ctx, b, 1);
        for (int s = 0; s < DEAR_FINITE_SLOTS; s++)
            dear_rt_fence_free(ctx, fb->fence[s]);
        if (fb->sq)
            ctx->mem.ops->release(fb->sq, 1);
    }
    if (ctx->finite.unchecked > 0)
        DEAR_INFO("finite", "rank %d: %lld reduce-scatters were not checked for non-finite values: the GPU ran "
                            "%d iterations behind",
                  ctx->cm.rank, ctx->finite.unchecked, DEAR_FINITE_SLOTS);
    free(ctx->finite.b);
    ctx->finite.b = NULL;
    ctx->finite.nb = 0;
    ctx->finite.unchecked = 0;
}

static int finite_graph(dear_ctx_t *ctx)
{
    int nb = ctx->graph.nbuckets;
    DEAR_ALLOC_CHECK(ctx->finite.b, calloc((size_t)nb, sizeof *ctx->finite.b), (size_t)nb * sizeof *ctx->finite.b);
    ctx->finite.nb = nb;
    for (int b = 0; b < nb; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        dear_finite_bucket_t *fb = &ctx->finite.b[b];
        /* Host memory the row's kernels can write squares into from their queue (pinned for a GPU). */
        DEAR_CHECK(ctx->mem.ops->alloc((size_t)DEAR_FINITE_SLOTS * (size_t)(bk->u1 - bk->u0 + 1) * sizeof(double), 1,
                                       (void **)&fb->sq));
        for (int s = 0; s < DEAR_FINITE_SLOTS; s++) {
            fb->iter[s] = -1;
            DEAR_CHECK(dear_rt_fence_new(ctx, &fb->fence[s]));
        }
        DEAR_CHECK(dear_op_hook(&bk->op, finite_before, NULL));
    }
    return DEAR_OK;
}

const dear_feature_t dear_feature_finite = {
    .decide = finite_decide,
    .on = dear_finite_on,
    .graph = finite_graph,
    .graph_free = finite_graph_free,
    .free = finite_graph_free,
};

/*
 * Sparse tensors: gradients whose blocks (rows) are mostly zero, such as a token embedding's,
 * declared with dear_register_sparse. Buckets are cut where the block changes (buckets.c), so a
 * bucket is either dense or sparse tensors of one block size and the block boundaries are the
 * rows (a sparse tensor is cut into chunks on rows only, fusion/units.h); an all-gather group of
 * sparse tensors gathers part of one bucket. Such a bucket's
 * collectives run the `sparse` algorithm (collectives/coll_sparse.c) with that block, per phase:
 * the reduce-scatter (or the all-reduce of wfbp and sync) and the all-gather. Under sharded
 * updates only the reduce-scatters may: the all-gathers carry the updated parameters, which are
 * dense, and no rank holds the averaged gradient whole to count the union's blocks.
 *
 * During the warm-up iterations the progress thread scans each sparse bucket around its
 * collectives: before the reduce-scatter (this rank's gradient) and after the all-gather (the
 * averaged one, the union over ranks). DEAR_SPARSE=auto then drains, takes the largest counts over
 * the ranks, and keeps a phase sparse only where its non-zero blocks with their indices are fewer
 * bytes than the dense blocks (with L ranks per host where a reduce-scatter falls back to hier,
 * L times them: on a host's link its exchange sends every rank's blocks, hier one combined
 * vector; an all-gather's cross once per host, through partners; dear_coll_sparse_copies): the
 * bytes are what the sparse form saves, and the slowest rank's density decides because every
 * rank must run the same algorithm.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/mpi_check.h"
#include "base/params.h"
#include "base/sync.h"
#include "base/util.h"
#include "runtime/rt.h"

/* Bytes a sparse message adds per block: its uint32 index (coll_sparse.c). */
#define SPARSE_IDX_BYTES 4

static int register_sparse_claimed(dear_ctx_t *ctx, int tensor, size_t row_elems)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_register_sparse: ctx is NULL");
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_register_sparse(tensor %d): the context is already committed; declare sparse tensors "
                          "before dear_commit (their buckets are built there)",
                   tensor);
        return DEAR_ERR_STATE;
    }
    DEAR_ARG_CHECK(tensor >= 0 && tensor < ctx->reg.ntensors,
                   "dear_register_sparse: tensor %d unknown; %d tensor(s) registered (indices from dear_tensor_index)",
                   tensor, ctx->reg.ntensors);
    dear_tensor_t *t = &ctx->reg.tensors[tensor];
    DEAR_ARG_CHECK(row_elems > 0, "dear_register_sparse('%s'): a block of 0 elements; pass the row length", t->name);
    DEAR_ARG_CHECK(t->count % row_elems == 0,
                   "dear_register_sparse('%s'): a block of %zu elements does not divide its count %zu; pass the row "
                   "length (count = rows x row_elems)",
                   t->name, row_elems, t->count);
    t->sparse_block = row_elems;
    return DEAR_OK;
}

int dear_register_sparse(dear_ctx_t *ctx, int tensor, size_t row_elems)
{
    DEAR_CLAIMED(ctx, "dear_register_sparse", register_sparse_claimed(ctx, tensor, row_elems));
}

size_t dear_tensor_block(const dear_ctx_t *ctx, int t)
{
    return ctx->sparse.mode == DEAR_SPARSE_OFF ? 0 : ctx->reg.tensors[t].sparse_block;
}

int dear_sparse_due(const dear_ctx_t *ctx)
{
    return ctx->sparse.decide_at >= 0 && ctx->it.iter >= ctx->sparse.decide_at;
}

/* Rank 0's setting holds: the algorithms must be the same on every rank. DEAR_SPARSE_BLOCK
 * replaces every sparse tensor's row as its block; the counts are alike on all ranks
 * (dear_registry_check), so all refuse the same tensor and none is left waiting. */
static int sparse_decide(dear_ctx_t *ctx)
{
    long long cfg[3] = { dear_param_enum(DEAR_P_SPARSE), dear_param_int(DEAR_P_WARMUP_ITERS),
                         dear_param_int(DEAR_P_SPARSE_BLOCK) };
    DEAR_MPI_CHECK(MPI_Bcast(cfg, 3, MPI_LONG_LONG, 0, ctx->cm.comm));
    ctx->sparse.mode = (int)cfg[0];
    ctx->sparse.measure_iters = cfg[1];
    ctx->sparse.decide_at = -1;
    size_t block = (size_t)cfg[2];
    for (int t = 0; block && t < ctx->reg.ntensors; t++) {
        dear_tensor_t *tt = &ctx->reg.tensors[t];
        if (tt->sparse_block && tt->count % block) {
            DEAR_ERROR("params", "DEAR_SPARSE_BLOCK=%zu does not divide the %zu elements of sparse tensor '%s'; "
                                 "give a divisor of every sparse tensor's count, or 0 for each tensor's row length",
                       block, tt->count, tt->name);
            return DEAR_ERR_PARAM;
        }
    }
    for (int t = 0; block && t < ctx->reg.ntensors; t++)
        if (ctx->reg.tensors[t].sparse_block)
            ctx->reg.tensors[t].sparse_block = block;
    return DEAR_OK;
}

int dear_sparse_any(const dear_ctx_t *ctx)
{
    for (int t = 0; t < ctx->reg.ntensors; t++)
        if (dear_tensor_block(ctx, t) > 0)
            return 1;
    return 0;
}

/* Sharded updates narrow the sparse tensors to their reduce-scatters: the all-gathers carry the
 * updated parameters, dense. Giving way to the deterministic mode sends them dense. */
static void sparse_yield(dear_ctx_t *ctx, dear_feat_t other)
{
    if (other == DEAR_FEAT_SHARD)
        ctx->sparse.rs_only = 1;
    else
        ctx->sparse.mode = DEAR_SPARSE_OFF;
}

/* Each sparse tensor's phases start sparse (the reduce-scatter only, sharded); auto decides after
 * the warm-up. */
static int sparse_setup(dear_ctx_t *ctx)
{
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        dear_tensor_t *tt = &ctx->reg.tensors[t];
        tt->sparse_rs = dear_tensor_block(ctx, t) > 0;
        tt->sparse_ag = tt->sparse_rs && !ctx->sparse.rs_only;
        if (tt->sparse_rs && ctx->sparse.mode == DEAR_SPARSE_AUTO)
            ctx->sparse.decide_at = ctx->sparse.measure_iters;
    }
    return DEAR_OK;
}

/* Count the non-zero blocks of units [u0, u1) of bucket bk in a warm-up iteration, into their
 * tensors' counts (a cut tensor's chunks, cut on rows, add up to the whole tensor's). */
static void scan(dear_ctx_t *ctx, const dear_op_t *op, const dear_bucket_t *bk, int u0, int u1, int averaged)
{
    if (op->sh.iter >= ctx->sparse.measure_iters)
        return;
    for (int u = u0; u < u1; u++) {
        dear_tensor_t *tt = &ctx->reg.tensors[ctx->graph.units[u].tensor];
        size_t count = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
        if (count == 0)
            continue;
        size_t nz = dear_coll_sparse_nonzero(tt->dtype, dear_unit_vec(ctx, u, 0), count, tt->sparse_block);
        dear_lock(&ctx->eng.lock);
        *(averaged ? &tt->sh.nz_ag : &tt->sh.nz_rs) += nz;
        *(averaged ? &tt->sh.blocks_ag : &tt->sh.blocks_rs) += count / tt->sparse_block;
        dear_unlock(&ctx->eng.lock);
    }
}

static void scan_own(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_bucket_t *bk = &ctx->graph.buckets[op->index];
    scan(ctx, op, bk, bk->u0, bk->u1, 0);
}

static void scan_reduced(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_bucket_t *bk = &ctx->graph.buckets[op->index];
    scan(ctx, op, bk, bk->u0, bk->u1, 1);
}

static void scan_gathered(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_group_t *gr = &ctx->graph.groups[op->index];
    scan(ctx, op, &ctx->graph.buckets[ctx->graph.units[gr->u0].bucket], gr->u0, gr->u1, 1);
}

/* Whether every unit of [u0, u1) runs the phase sparse. */
static int all_sparse(const dear_ctx_t *ctx, int u0, int u1, int ag)
{
    for (int u = u0; u < u1; u++) {
        const dear_tensor_t *tt = &ctx->reg.tensors[ctx->graph.units[u].tensor];
        if (!(ag ? tt->sparse_ag : tt->sparse_rs))
            return 0;
    }
    return 1;
}

static void set_algo(dear_op_t *op, size_t block, int sparse)
{
    op->args.algo = sparse ? DEAR_ALGO_SPARSE : DEAR_ALGO_AUTO;
    op->args.sparse_block = block;
}

/* Each sparse bucket's and group's algorithm, from its tensors' phases; hooks 1: with the density
 * scans of the warm-up around them (the graph step; a decision later changes the algorithms only). */
static int sparse_ops(dear_ctx_t *ctx, int hooks)
{
    int split = dear_rt_split(ctx);
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        if (bk->sparse_block == 0)
            continue;
        set_algo(&bk->op, bk->sparse_block, all_sparse(ctx, bk->u0, bk->u1, 0));
        if (hooks) /* an all-reduce leaves the averaged vector */
            DEAR_CHECK(dear_op_hook(&bk->op, scan_own, split ? NULL : scan_reduced));
    }
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        dear_group_t *gr = &ctx->graph.groups[g];
        size_t block = ctx->graph.buckets[ctx->graph.units[gr->u0].bucket].sparse_block;
        if (block == 0)
            continue;
        set_algo(&gr->op, block, all_sparse(ctx, gr->u0, gr->u1, 1));
        if (hooks && !ctx->sparse.rs_only) /* sharded, it gathers parameters: nothing to count */
            DEAR_CHECK(dear_op_hook(&gr->op, NULL, scan_gathered));
    }
    return DEAR_OK;
}

static int sparse_graph(dear_ctx_t *ctx)
{
    return sparse_ops(ctx, 1);
}

void dear_sparse_record(dear_ctx_t *ctx, const dear_op_t *op, const dear_coll_info_t *info)
{
    if (info->algo != DEAR_ALGO_SPARSE || op->index < 0)
        return;
    int ag = op->kind == DEAR_COLL_ALLGATHER;
    int u0 = ag ? ctx->graph.groups[op->index].u0 : ctx->graph.buckets[op->index].u0;
    int u1 = ag ? ctx->graph.groups[op->index].u1 : ctx->graph.buckets[op->index].u1;
    /* Each tensor with a chunk in the collective counts it once. */
    for (int u = u0; u < u1; u++) {
        if (u > u0 && ctx->graph.units[u].tensor == ctx->graph.units[u - 1].tensor)
            continue;
        dear_tensor_t *tt = &ctx->reg.tensors[ctx->graph.units[u].tensor];
        tt->sh.sp_sent += info->bytes_sent;
        tt->sh.sp_msgs_sparse += info->msgs_sparse;
        tt->sh.sp_msgs_dense += info->msgs_dense;
    }
}

/* The sparse form pays when nz non-zero blocks of `row` bytes, each with its index, `copies`
 * times over are fewer bytes than all `blocks` of them. */
static int pays(uint64_t nz, uint64_t blocks, size_t row, int copies)
{
    return blocks > 0 &&
           (double)copies * (double)nz * (double)(row + SPARSE_IDX_BYTES) < (double)blocks * (double)row;
}

static double ratio(uint64_t nz, uint64_t blocks) { return blocks > 0 ? (double)nz / (double)blocks : -1; }

const char *dear_sparse_phases(const dear_ctx_t *ctx, int rs, int ag, char *buf, size_t len)
{
    if (dear_rt_split(ctx))
        snprintf(buf, len, "reduce-scatter %s, all-gather %s", rs ? "sparse" : "dense", ag ? "sparse" : "dense");
    else
        snprintf(buf, len, "all-reduce %s", rs ? "sparse" : "dense");
    return buf;
}

int dear_sparse_decide(dear_ctx_t *ctx)
{
    ctx->sparse.decide_at = -1;
    /* Nothing in flight: the communicator is this thread's for the reduction, and the algorithms
     * change between two iterations on every rank. */
    if (ctx->cfg.sched_ops->drain)
        DEAR_CHECK(ctx->cfg.sched_ops->drain(ctx));
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        dear_tensor_t *tt = &ctx->reg.tensors[t];
        if (dear_tensor_block(ctx, t) == 0)
            continue;
        dear_lock(&ctx->eng.lock);
        uint64_t mine[4] = { tt->sh.nz_rs, tt->sh.nz_ag, tt->sh.blocks_rs, tt->sh.blocks_ag }, most[4];
        dear_unlock(&ctx->eng.lock);
        DEAR_MPI_CHECK(MPI_Allreduce(mine, most, 4, MPI_UINT64_T, MPI_MAX, ctx->cm.comm));
        size_t row = tt->sparse_block * dear_dtype_size(tt->dtype);
        size_t bytes = tt->count * dear_dtype_size(tt->dtype);
        /* Each phase by its own fall-back: an all-reduce's exchange is a reduce-scatter's, then an
         * all-gather's, and 16-bit sums fall back to the ring, not hier. */
        int copies = dear_coll_sparse_copies(DEAR_COLL_REDUCE_SCATTER, tt->dtype, bytes, ctx->cm.size,
                                             ctx->cm.coll_topo);
        int copies_ag = dear_coll_sparse_copies(DEAR_COLL_ALLGATHER, tt->dtype, bytes, ctx->cm.size,
                                                ctx->cm.coll_topo);
        char phases[64], uni[48] = "";
        tt->sparse_rs = pays(most[0], most[2], row, copies);
        tt->sparse_ag = !ctx->sparse.rs_only && pays(most[1], most[3], row, copies_ag);
        if (!ctx->sparse.rs_only) /* sharded, the average is never whole on a rank */
            snprintf(uni, sizeof uni, ", %.3f in the average", ratio(most[1], most[3]));
        DEAR_INFO("sparse", "tensor '%s' (block %zu): %.3f of its blocks non-zero on this rank, %.3f on the densest "
                            "rank%s over %lld warm-up iteration(s)%s: %s",
                  tt->name, tt->sparse_block, ratio(mine[0], mine[2]), ratio(most[0], most[2]), uni,
                  ctx->sparse.measure_iters,
                  copies > 1 ? "; the reduce-scatter's exchange crosses the link once per rank, hier once per host"
                             : "",
                  dear_sparse_phases(ctx, tt->sparse_rs, tt->sparse_ag, phases, sizeof phases));
    }
    return sparse_ops(ctx, 0);
}

/* The first release of dear_sparse_stats_t ends with msgs_dense. */
#define SPARSE_STATS_MIN_SIZE (offsetof(dear_sparse_stats_t, msgs_dense) + sizeof(uint64_t))

int dear_sparse_stats_claimed(dear_ctx_t *ctx, int tensor, dear_sparse_stats_t *stats)
{
    DEAR_ARG_CHECK(ctx != NULL && stats != NULL, "dear_get_sparse_stats: %s is NULL", ctx ? "stats" : "ctx");
    DEAR_ARG_CHECK(stats->size >= SPARSE_STATS_MIN_SIZE,
                   "dear_get_sparse_stats: stats->size is %zu; set it to sizeof(dear_sparse_stats_t) first",
                   stats->size);
    if (!ctx->committed) {
        DEAR_ERROR("api", "dear_get_sparse_stats(tensor %d): the context is not committed", tensor);
        return DEAR_ERR_STATE;
    }
    DEAR_ARG_CHECK(tensor >= 0 && tensor < ctx->reg.ntensors,
                   "dear_get_sparse_stats: tensor %d unknown; %d tensor(s) registered", tensor, ctx->reg.ntensors);
    const dear_tensor_t *tt = &ctx->reg.tensors[tensor];
    size_t block = dear_tensor_block(ctx, tensor);
    dear_sparse_stats_t s = { .size = stats->size, .block = tt->sparse_block };
    /* What runs, not what the tensor alone would pay for: a bucket is sparse only if all its
     * tensors are; a cut tensor runs a phase sparse when every collective carrying a chunk of it
     * does. */
    s.sparse_rs = s.sparse_ag = block > 0;
    for (int u = tt->u0; u < tt->u1 && block > 0; u++) {
        s.sparse_rs &= ctx->graph.buckets[ctx->graph.units[u].bucket].op.args.algo == DEAR_ALGO_SPARSE;
        if (ctx->graph.ngroups > 0)
            s.sparse_ag &= ctx->graph.groups[dear_group_of(&ctx->graph, u)].op.args.algo == DEAR_ALGO_SPARSE;
    }
    if (ctx->graph.ngroups == 0)
        s.sparse_ag = 0;
    dear_lock(&ctx->eng.lock);
    s.density = ratio(tt->sh.nz_rs, tt->sh.blocks_rs);
    s.density_union = ratio(tt->sh.nz_ag, tt->sh.blocks_ag);
    s.bytes_sent = tt->sh.sp_sent;
    s.msgs_sparse = tt->sh.sp_msgs_sparse;
    s.msgs_dense = tt->sh.sp_msgs_dense;
    dear_unlock(&ctx->eng.lock);
    memcpy(stats, &s, stats->size < sizeof s ? stats->size : sizeof s);
    return DEAR_OK;
}

int dear_get_sparse_stats(dear_ctx_t *ctx, int tensor, dear_sparse_stats_t *stats)
{
    DEAR_CLAIMED(ctx, "dear_get_sparse_stats", dear_sparse_stats_claimed(ctx, tensor, stats));
}

static const dear_feature_rule_t sparse_rules[] = {
    { DEAR_RULE_YIELDS, DEAR_FEAT_SHARD, DEAR_WHEN_ALWAYS,
      "tensors declared sparse send only their reduce-scatters sparse (the all-gathers carry parameters, which "
      "are dense)" },
    { DEAR_RULE_GIVES_WAY, DEAR_FEAT_DETERMINISTIC, DEAR_WHEN_ALWAYS,
      "tensors declared sparse travel dense (the sparse exchange sums in its own order, the direct one in rank "
      "order)" },
    { DEAR_RULE_REFUSES, DEAR_FEAT_CUDA, DEAR_WHEN_ALWAYS,
      "the block-sparse collectives find the zero blocks on the host and cannot scan CUDA memory; set "
      "DEAR_SPARSE=off to send those tensors dense, or do not declare them sparse" },
    { DEAR_RULE_END, 0, 0, NULL },
};

const dear_feature_t dear_feature_sparse = {
    .after = DEAR_FEAT_BIT(SHARD) | DEAR_FEAT_BIT(DETERMINISTIC),
    .rules = sparse_rules,
    .decide = sparse_decide,
    .on = dear_sparse_any,
    .yield = sparse_yield,
    .setup = sparse_setup,
    .graph = sparse_graph,
};

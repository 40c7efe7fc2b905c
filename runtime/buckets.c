/*
 * What a plan becomes: buckets with their vectors (the gradients themselves when a bucket's
 * tensors lie back to back in memory, else a fusion buffer), all-gather groups with their
 * blocks, and the operations of one iteration in the fixed order every rank runs them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/util.h"
#include "runtime/rt.h"

/* The units of ctx->graph.plan with their elements, each tensor's units and each layer's. The
 * plan was checked against the tensors (dear_planning_bcast), so every cut is on an element. */
static int units_build(dear_ctx_t *ctx)
{
    int rc = DEAR_OK, n = ctx->graph.plan.nunits;
    const dear_unit_t *pu = ctx->graph.plan.units;
    DEAR_ALLOC_GOTO(ctx->graph.units, calloc((size_t)(n ? n : 1), sizeof *ctx->graph.units),
                    sizeof *ctx->graph.units * (size_t)(n ? n : 1), rc, out);
    ctx->graph.nunits = n;
    size_t pos = 0;
    for (int i = 0; i < n; i++) {
        dear_rt_unit_t *u = &ctx->graph.units[i];
        dear_tensor_t *tt = &ctx->reg.tensors[pu ? pu[i].tensor : i];
        size_t esz = dear_dtype_size(tt->dtype);
        u->tensor = pu ? pu[i].tensor : i;
        u->eoff = pu && pu[i].bytes > 0 ? pu[i].offset / esz : 0;
        u->count = pu && pu[i].bytes > 0 ? pu[i].bytes / esz : tt->count;
        /* Sharded updates: by the unit alone, so no plan moves a slice (shard.c). */
        dear_coll_shard(u->count, ctx->cm.size, ctx->cm.rank, &u->own_off, &u->own_len);
        u->own_pos = pos;
        pos += u->own_len;
        if (i == 0 || u->tensor != ctx->graph.units[i - 1].tensor)
            tt->u0 = i;
        tt->u1 = i + 1;
    }
    for (int l = 0; l < ctx->reg.nlayers; l++) {
        dear_layer_t *L = &ctx->reg.layers[l];
        L->u0 = L->t0 < ctx->reg.ntensors ? ctx->reg.tensors[L->t0].u0 : n;
        L->u1 = L->t1 > L->t0 ? ctx->reg.tensors[L->t1 - 1].u1 : L->u0;
    }
out:
    return rc;
}

size_t dear_unit_ccount(const dear_graph_t *g, const dear_registry_t *reg, int u)
{
    const dear_rt_unit_t *un = &g->units[u];
    return reg->tensors[un->tensor].frozen ? 0 : un->count;
}

char *dear_unit_grad(const dear_graph_t *g, const dear_registry_t *reg, int u)
{
    const dear_rt_unit_t *un = &g->units[u];
    const dear_tensor_t *tt = &reg->tensors[un->tensor];
    return (char *)tt->grad + un->eoff * dear_dtype_size(tt->dtype);
}

int dear_group_of(const dear_graph_t *g, int u)
{
    int lo = 0, hi = g->ngroups - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g->groups[mid].u0 <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static const dear_tensor_t *unit_tensor(const dear_ctx_t *ctx, int u)
{
    return &ctx->reg.tensors[ctx->graph.units[u].tensor];
}

/* A collective carries one element type and one sparse block (sparse.c): cut every group where
 * either changes, whatever the planner merged. A sparse all-gather group is also cut where the
 * bucket changes, so that it gathers part of one bucket and its blocks start on rows (a sparse
 * tensor is cut on rows only). The result is the same on every rank because the registries are. */
static int split_groups(const dear_ctx_t *ctx, const dear_partition_t *in, int by_bucket, int **first_out, int *ng_out)
{
    int rc = DEAR_OK, n = ctx->graph.nunits, ng = 0;
    int *first = NULL;
    DEAR_ALLOC_GOTO(first, malloc(sizeof(int) * (size_t)(n + 1)), sizeof(int) * (size_t)(n + 1), rc, err);
    for (int g = 0; g < in->ngroups; g++)
        for (int u = in->first[g]; u < in->first[g + 1]; u++) {
            int t = ctx->graph.units[u].tensor, tp = u > 0 ? ctx->graph.units[u - 1].tensor : t;
            if (u == in->first[g] || ctx->reg.tensors[t].dtype != ctx->reg.tensors[tp].dtype ||
                dear_tensor_block(ctx, t) != dear_tensor_block(ctx, tp) ||
                (by_bucket && dear_tensor_block(ctx, t) > 0 &&
                 ctx->graph.units[u].bucket != ctx->graph.units[u - 1].bucket))
                first[ng++] = u;
        }
    first[ng] = n;
    *first_out = first;
    *ng_out = ng;
    return DEAR_OK;
err:
    return rc;
}

static void op_layers(dear_ctx_t *ctx, dear_op_t *op, int u0, int u1)
{
    op->layer_lo = unit_tensor(ctx, u0)->layer;
    op->layer_hi = unit_tensor(ctx, u1 - 1)->layer;
}

/* What every operation's collective shares: the kind, the context's communicator and hosts, the
 * selection table's algorithm, and for the gradients' buckets and groups the memory their
 * buffers lie in and the transport that runs their collectives (NCCL's for CUDA gradients, else
 * the context's); the context's own small vectors (the norm, the counts) are host memory on the
 * context's transport. */
static void op_init(const dear_ctx_t *ctx, dear_op_t *op, dear_coll_op_t kind, int index, dear_dtype_t dtype)
{
    int gradients = index >= 0;
    op->kind = kind;
    op->index = index;
    op->sh.done_iter = op->sh.launch_iter = -1;
    op->pt.prep_iter = -1;
    op->args.op = kind;
    op->args.algo = DEAR_ALGO_AUTO;
    op->args.dtype = dtype;
    op->args.comm = ctx->cm.comm;
    op->args.net = gradients ? dear_rt_work_net(ctx) : ctx->cm.net;
    op->args.topo = ctx->cm.coll_topo;
    op->args.mem = gradients ? dear_rt_work_ops(ctx) : &dear_mem_host_ops;
    op->args.scale = 1.0;
    if (gradients)
        dear_compress_args(ctx, op);
}

void dear_op_sum(dear_ctx_t *ctx, dear_op_t *op, int pos, int index, dear_dtype_t dtype, void *buf, size_t count)
{
    op_init(ctx, op, DEAR_COLL_ALLREDUCE, index, dtype);
    op->pos = pos;
    op->layer_lo = ctx->reg.tensors[0].layer;
    op->layer_hi = ctx->reg.tensors[ctx->reg.ntensors - 1].layer;
    op->bytes = count * dear_dtype_size(dtype);
    op->args.recvbuf = buf;
    op->args.count = count;
}

/* Room for the pieces of every dense bucket (one per all-gather group meeting it; the groups
 * from first[0..ng]) when schedule dear runs. */
static int sub_alloc(dear_ctx_t *ctx, const int *first, int ng)
{
    int rc = DEAR_OK;
    int *n = NULL;
    size_t nb = (size_t)ctx->graph.nbuckets;
    DEAR_ALLOC_GOTO(n, calloc(nb, sizeof(int)), nb * sizeof(int), rc, out);
    for (int g = 0; g < ng; g++)
        for (int b = ctx->graph.units[first[g]].bucket; b <= ctx->graph.units[first[g + 1] - 1].bucket; b++)
            n[b]++;
    for (size_t b = 0; b < nb; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        if (bk->sparse_block == 0 && n[b] > 0)
            DEAR_ALLOC_GOTO(bk->sub, calloc((size_t)n[b], sizeof *bk->sub), sizeof *bk->sub * (size_t)n[b], rc, out);
    }
out:
    free(n);
    return rc;
}

/* A group's block [lo, hi) of bucket bk becomes a vector of its own: the bucket's next piece,
 * and the group gathers that piece whole. Empty ranges (frozen units only) add no piece. */
static void sub_add(dear_bucket_t *bk, dear_coll_block_t *blk)
{
    size_t n = blk->hi - blk->lo;
    blk->buf = (char *)bk->buf + blk->lo * dear_dtype_size(bk->dtype);
    blk->count = blk->hi = n;
    blk->lo = 0;
    if (n > 0)
        bk->sub[bk->nsub++] = *blk;
}

char *dear_bucket_own(const dear_rt_comm_t *cm, const dear_bucket_t *b, int k, size_t *len)
{
    size_t off;
    char *vec = b->nsub > 0 ? b->sub[k].buf : b->buf;
    dear_coll_shard(b->nsub > 0 ? b->sub[k].count : b->count, cm->size, cm->rank, &off, len);
    return vec + off * dear_dtype_size(b->dtype);
}

/* Bucket b over units [u0, u1): its vector (the gradients themselves when its units lie back
 * to back, else a buffer of its own) and its reduce-scatter or all-reduce. */
static int bucket_build(dear_ctx_t *ctx, int b, int u0, int u1)
{
    dear_bucket_t *bk = &ctx->graph.buckets[b];
    bk->u0 = u0;
    bk->u1 = u1;
    bk->dtype = unit_tensor(ctx, bk->u0)->dtype;
    bk->sparse_block = dear_tensor_block(ctx, ctx->graph.units[bk->u0].tensor);
    /* The bucket's vector: its units whose tensor is not frozen, back to back. */
    int contiguous = 1;
    char *start = NULL, *end = NULL;
    size_t esz = dear_dtype_size(bk->dtype);
    for (int u = bk->u0; u < bk->u1; u++) {
        dear_rt_unit_t *un = &ctx->graph.units[u];
        un->bucket = b;
        un->off = bk->count;
        size_t c = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
        if (c == 0)
            continue;
        bk->count += c;
        char *p = dear_unit_grad(&ctx->graph, &ctx->reg, u);
        if (end != NULL && end != p)
            contiguous = 0;
        if (start == NULL)
            start = p;
        end = p + c * esz;
    }
    bk->bytes = bk->count * esz;
    /* One rank communicates nothing: its buckets are never packed or unpacked, unless clipping
     * scales the bucket's vector in place (clip.c). Staged memory always has its host copy.
     * Sharded updates cut every bucket into its units, each a block of its own (shard_pieces), so
     * the collectives reach the gradients wherever they lie. */
    int shard = dear_shard_on(ctx);
    if ((contiguous || (ctx->cm.size == 1 && !dear_clip_on(ctx)) || shard) && !ctx->mem.staged) {
        bk->buf = start;
    } else {
        DEAR_CHECK(ctx->mem.ops->alloc(bk->bytes ? bk->bytes : 1, ctx->mem.staged, &bk->buf));
        bk->fused = 1;
        if (shard) /* and the host copy of its parameters, for the all-gathers */
            DEAR_CHECK(ctx->mem.ops->alloc(bk->bytes ? bk->bytes : 1, ctx->mem.staged, &bk->pbuf));
    }
    dear_op_t *op = &bk->op;
    op_init(ctx, op, shard ? DEAR_COLL_REDUCE_SCATTER : ctx->cfg.sched_ops->bucket_op, b, bk->dtype);
    op->bytes = bk->bytes;
    op_layers(ctx, op, bk->u0, bk->u1);
    op->args.scale = 1.0 / ctx->cm.size; /* averaging fused into the reduction */
    op->args.sendbuf = NULL;              /* in place */
    op->args.recvbuf = bk->buf;
    op->args.count = bk->count;
    return DEAR_OK;
}

/* The plan's reduce-scatter buckets, cut where the type or the block changes. */
static int buckets_build(dear_ctx_t *ctx)
{
    int rc = DEAR_OK, *first = NULL, ng = 0;
    DEAR_CHECK_GOTO(split_groups(ctx, &ctx->graph.plan.rs, 0, &first, &ng), rc, out);
    DEAR_ALLOC_GOTO(ctx->graph.buckets, calloc((size_t)ng, sizeof *ctx->graph.buckets),
                    sizeof *ctx->graph.buckets * (size_t)ng, rc, out);
    ctx->graph.nbuckets = ng;
    for (int b = 0; b < ng && rc == DEAR_OK; b++)
        rc = bucket_build(ctx, b, first[b], first[b + 1]);
out:
    free(first);
    return rc;
}

char *dear_unit_vec(const dear_ctx_t *ctx, int u, int params)
{
    const dear_rt_unit_t *un = &ctx->graph.units[u];
    const dear_bucket_t *bk = &ctx->graph.buckets[un->bucket];
    const dear_tensor_t *tt = &ctx->reg.tensors[un->tensor];
    size_t esz = dear_dtype_size(tt->dtype);
    if (bk->fused)
        return (char *)(params ? bk->pbuf : bk->buf) + un->off * esz;
    return (char *)(params ? tt->param : tt->grad) + un->eoff * esz;
}

/* Sharded updates: every unit of the group a block of its own, its parameters gathered whole from
 * the slices of every rank (the slices' rule); units of frozen tensors gather nothing. Returns
 * the number of blocks and adds their bytes to the operation's. */
static int shard_group_blocks(dear_ctx_t *ctx, const dear_group_t *gr, dear_op_t *op)
{
    int n = 0;
    for (int u = gr->u0; u < gr->u1; u++) {
        size_t c = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
        if (c == 0)
            continue;
        op->blocks[n++] = (dear_coll_block_t){ .buf = dear_unit_vec(ctx, u, 1), .count = c, .lo = 0, .hi = c };
        op->bytes += c * dear_dtype_size(unit_tensor(ctx, u)->dtype);
    }
    return n;
}

/* Sharded updates: every bucket's reduce-scatter is a block per unit, so that each rank's slice of
 * a unit is the same under every plan. */
static int shard_pieces(dear_ctx_t *ctx)
{
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        size_t n = (size_t)(bk->u1 - bk->u0);
        DEAR_ALLOC_CHECK(bk->sub, calloc(n, sizeof *bk->sub), sizeof *bk->sub * n);
        for (int u = bk->u0; u < bk->u1; u++) {
            size_t c = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
            if (c > 0)
                bk->sub[bk->nsub++] = (dear_coll_block_t){ .buf = dear_unit_vec(ctx, u, 0), .count = c, .lo = 0, .hi = c };
        }
        bk->op.args.nblocks = bk->nsub;
        bk->op.args.blocks = bk->sub;
    }
    return DEAR_OK;
}

/* Group g over units [u0, u1): its all-gather of the buckets' blocks, the piece of each bucket
 * it gathers (when buckets are sharded piece by piece), and what it waits for; early if it runs
 * during backward. */
static int group_build(dear_ctx_t *ctx, int g, int u0, int u1, int early)
{
    dear_group_t *gr = &ctx->graph.groups[g];
    gr->u0 = u0;
    gr->u1 = u1;
    dear_op_t *op = &gr->op;
    int shard = dear_shard_on(ctx);
    int b0 = ctx->graph.units[gr->u0].bucket, b1 = ctx->graph.units[gr->u1 - 1].bucket;
    int nb = b1 - b0 + 1, nblk = shard ? u1 - u0 : nb;
    DEAR_ALLOC_CHECK(op->blocks, calloc((size_t)nblk, sizeof *op->blocks), sizeof *op->blocks * (size_t)nblk);
    size_t nd = (size_t)(nb + DEAR_FEAT_COUNT); /* and room for the barriers (barrier_deps) */
    DEAR_ALLOC_CHECK(op->deps, calloc(nd, sizeof *op->deps), sizeof *op->deps * nd);
    if (shard)
        nblk = shard_group_blocks(ctx, gr, op);
    for (int b = b0; b <= b1; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        int lo_u = gr->u0 > bk->u0 ? gr->u0 : bk->u0;
        int hi_u = gr->u1 < bk->u1 ? gr->u1 : bk->u1;
        op->deps[b - b0] = (dear_op_t *)&bk->op;
        if (shard)
            continue;
        dear_coll_block_t *blk = &op->blocks[b - b0];
        blk->buf = bk->buf;
        blk->count = bk->count;
        blk->lo = ctx->graph.units[lo_u].off;
        blk->hi = ctx->graph.units[hi_u - 1].off + dear_unit_ccount(&ctx->graph, &ctx->reg, hi_u - 1);
        op->bytes += (blk->hi - blk->lo) * dear_dtype_size(bk->dtype);
        if (bk->sub != NULL)
            sub_add(bk, blk);
    }
    op->ndeps = nb;
    gr->early = early;
    ctx->graph.ngroups_early += gr->early;
    op_init(ctx, op, DEAR_COLL_ALLGATHER, g, unit_tensor(ctx, gr->u0)->dtype);
    op_layers(ctx, op, gr->u0, gr->u1);
    op->args.nblocks = nblk;
    op->args.blocks = op->blocks;
    return DEAR_OK;
}

/* The all-gather groups of a split schedule. A group is early if the plan's group holding its
 * first unit is (cutting by type only splits groups); none while clipping (they would gather
 * unclipped shards). A bucket the groups cut becomes a multi-block reduce-scatter over its
 * pieces. */
static int groups_build(dear_ctx_t *ctx)
{
    int rc = DEAR_OK, *first = NULL, ng = 0, clip = dear_clip_on(ctx);
    const dear_plan_t *pl = &ctx->graph.plan;
    /* Sharded updates: the parameters leave after the updates, so a group runs during backward
     * only where slices are stepped there; wfbp's and sync's plans gather what each bucket reduced. */
    int shard = dear_shard_on(ctx), split = (dear_sched_flags(ctx->cfg.sched) & DEAR_SCHED_F_SPLIT) != 0;
    int early_ok = !clip && (!shard || dear_shard_steps_early(ctx));
    const dear_partition_t *ag = split ? &pl->ag : &pl->rs;
    int early_on = split && pl->ag_early > 0 && early_ok;
    DEAR_CHECK_GOTO(split_groups(ctx, ag, 1, &first, &ng), rc, out);
    DEAR_ALLOC_GOTO(ctx->graph.groups, calloc((size_t)ng, sizeof *ctx->graph.groups),
                    sizeof *ctx->graph.groups * (size_t)ng, rc, out);
    ctx->graph.ngroups = ng;
    DEAR_CHECK_GOTO(shard ? shard_pieces(ctx) : sub_alloc(ctx, first, ng), rc, out);
    for (int g = 0, pg = 0; g < ng && rc == DEAR_OK; g++) {
        for (; early_on && pg + 1 < pl->ag.ngroups && pl->ag.first[pg + 1] <= first[g]; pg++)
            ; /* the plan's group holding unit first[g] */
        rc = group_build(ctx, g, first[g], first[g + 1], early_on && dear_plan_is_early(pl, pg));
    }
    for (int b = 0; b < ctx->graph.nbuckets && !shard; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        if (bk->nsub > 1) {
            bk->op.args.nblocks = bk->nsub;
            bk->op.args.blocks = bk->sub;
        }
    }
out:
    free(first);
    return rc;
}

/* Bucket b's early groups (those of early_lo..early_hi that run early), last first, into the
 * order from *pos. */
static void place_early(dear_ctx_t *ctx, int b, int *pos)
{
    for (int g = ctx->graph.buckets[b].early_hi; g >= ctx->graph.buckets[b].early_lo; g--) {
        if (!ctx->graph.groups[g].early)
            continue;
        ctx->graph.groups[g].op.pos = *pos;
        ctx->graph.ops[(*pos)++] = &ctx->graph.groups[g].op;
    }
}

/* One iteration's operations in their fixed order: buckets as backward completes them (last
 * first), each followed by the early all-gather groups whose data it completes (the bucket
 * holding a group's first unit is the last of its dependencies to finish; groups last first),
 * then the count of ranks with a gradient and the norm, then the other all-gathers in forward
 * order. With sharded slices stepped during backward a group is queued only at the hook that
 * steps them, after its bucket is done: it then follows the next bucket instead, so that this
 * bucket's start never waits for that hook. The simulator assumes exactly this order
 * (fusion/sim.h). */
static int ops_order(dear_ctx_t *ctx)
{
    ctx->graph.nops = ctx->graph.nbuckets + ctx->graph.nbarriers + ctx->graph.ngroups;
    size_t bytes = sizeof *ctx->graph.ops * (size_t)ctx->graph.nops;
    DEAR_ALLOC_CHECK(ctx->graph.ops, malloc(bytes), bytes);
    int ge = ctx->graph.ngroups - 1, pos = 0, nb = ctx->graph.nbuckets;
    for (int b = nb - 1; b >= 0; b--) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        /* the span of the early ones among the groups whose first unit lies in bucket b (the
         * first found, walking down, is its top; none if lo > hi) */
        bk->early_lo = ge + 1;
        bk->early_hi = ge;
        for (; ge >= 0 && ctx->graph.units[ctx->graph.groups[ge].u0].bucket == b; ge--)
            if (ctx->graph.groups[ge].early) {
                if (bk->early_lo > bk->early_hi)
                    bk->early_hi = ge;
                bk->early_lo = ge;
            }
    }
    int lag = dear_shard_steps_early(ctx); /* sharded, slices stepped in backward */
    for (int b = nb - 1; b >= 0; b--) {
        ctx->graph.buckets[b].op.pos = pos;
        ctx->graph.ops[pos++] = &ctx->graph.buckets[b].op;
        if (b + lag < nb)
            place_early(ctx, b + lag, &pos);
    }
    if (lag && nb > 0)
        place_early(ctx, 0, &pos);
    for (int i = 0; i < ctx->graph.nbarriers; i++) {
        ctx->graph.barrier[i]->pos = pos;
        ctx->graph.ops[pos++] = ctx->graph.barrier[i];
    }
    for (int g = 0; g < ctx->graph.ngroups; g++)
        if (!ctx->graph.groups[g].early) {
            ctx->graph.groups[g].op.pos = pos;
            ctx->graph.ops[pos++] = &ctx->graph.groups[g].op;
        }
    return DEAR_OK;
}

static void graph_log(const dear_ctx_t *ctx)
{
    int nfused = 0, ncut = 0;
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        nfused += ctx->graph.buckets[b].fused;
        ncut += ctx->graph.buckets[b].nsub > 1;
    }
    DEAR_INFO("plan", "planner %s: %d bucket(s) (%d with a fusion buffer, %d zero-copy, %d sharded in pieces at "
                      "all-gather group boundaries), %d all-gather group(s) (%d during backward), %d tensor(s) in "
                      "%d unit(s) and %d layer(s)",
              ctx->graph.plan.planner, ctx->graph.nbuckets, nfused, ctx->graph.nbuckets - nfused, ncut,
              ctx->graph.ngroups, ctx->graph.ngroups_early, ctx->reg.ntensors, ctx->graph.nunits, ctx->reg.nlayers);
}

int dear_op_hook(dear_op_t *op, void (*before)(dear_ctx_t *, dear_op_t *), void (*after)(dear_ctx_t *, dear_op_t *))
{
    /* More hooks than features can put on one operation is a defect of the table's rows. */
    if (op->nhooks == DEAR_OP_HOOKS) {
        DEAR_ERROR("plan", "operation %d carries more than %d feature hooks; raise DEAR_OP_HOOKS", op->index,
                   DEAR_OP_HOOKS);
        return DEAR_ERR_INTERNAL;
    }
    op->hooks[op->nhooks++] = (dear_op_hook_t){ before, after };
    return DEAR_OK;
}

void dear_graph_barrier(dear_ctx_t *ctx, dear_op_t *op)
{
    ctx->graph.barrier[ctx->graph.nbarriers++] = op;
}

void dear_graph_queue_barriers(dear_ctx_t *ctx)
{
    for (int i = 0; i < ctx->graph.nbarriers; i++)
        dear_engine_queue(ctx, ctx->graph.barrier[i]);
}

int dear_graph_wait_barriers(dear_ctx_t *ctx, long long iter)
{
    for (int i = 0; i < ctx->graph.nbarriers; i++)
        DEAR_CHECK(dear_engine_wait(ctx, ctx->graph.barrier[i], iter));
    return DEAR_OK;
}

/* Every all-gather but the early ones waits for the barriers. An early group runs before them
 * (they follow every bucket): its updates wait for them instead (sched_dear.c). */
static void barrier_deps(dear_ctx_t *ctx)
{
    for (int g = 0; g < ctx->graph.ngroups; g++) {
        dear_op_t *op = &ctx->graph.groups[g].op;
        for (int i = 0; i < ctx->graph.nbarriers && !ctx->graph.groups[g].early; i++)
            op->deps[op->ndeps++] = ctx->graph.barrier[i];
    }
}

/* Buckets, groups, fusion buffers and the operation order of ctx->graph.plan, in steps: units,
 * buckets, the all-gather groups of a split schedule (none early under clipping), the features'
 * steps (feature table: their hooks, and their barriers between the reduce-scatters and the
 * all-gathers, such as the count of ranks with a gradient and the norm), the memory's fences,
 * the order. */
int dear_graph_build(dear_ctx_t *ctx)
{
    if (DEAR_LOG_ON(DEAR_LOG_DEBUG) && ctx->cm.rank == 0)
        dear_plan_print(stderr, &ctx->graph.plan, NULL);
    if (dear_shard_on(ctx) && !dear_shard_steps_early(ctx))
        dear_plan_set_early(&ctx->graph.plan, NULL); /* the parameters leave after the updates at backward_end */
    ctx->graph.ngroups_early = 0;
    ctx->graph.nbarriers = 0;
    ctx->graph.gen++;
    DEAR_CHECK(units_build(ctx));
    DEAR_CHECK(buckets_build(ctx));
    if (dear_rt_split(ctx))
        DEAR_CHECK(groups_build(ctx));
    DEAR_CHECK(dear_features_graph(ctx));
    barrier_deps(ctx);
    DEAR_CHECK(dear_rt_mem_graph(ctx));
    DEAR_CHECK(ops_order(ctx));
    graph_log(ctx);
    return DEAR_OK;
}

static void ops_free(dear_ctx_t *ctx);

int dear_graph_rebuild(dear_ctx_t *ctx, const dear_plan_t *plan)
{
    dear_plan_t copy = { 0 };
    DEAR_CHECK(dear_plan_copy(&copy, plan));
    ops_free(ctx);
    dear_plan_free(&ctx->graph.plan);
    ctx->graph.plan = copy;
    ctx->graph.nbuckets = ctx->graph.ngroups = ctx->graph.nops = 0;
    DEAR_CHECK(dear_graph_build(ctx));
    for (int g = 0; g < ctx->graph.ngroups; g++)
        ctx->graph.groups[g].unpacked = 1;
    return DEAR_OK;
}

void dear_graph_free(dear_ctx_t *ctx)
{
    ops_free(ctx);
    dear_plan_free(&ctx->graph.plan);
}

static void ops_free(dear_ctx_t *ctx)
{
    dear_rt_mem_graph_free(ctx);
    /* The features' parts go while the buckets and units they name are still there. */
    dear_features_graph_free(ctx);
    for (int b = 0; ctx->graph.buckets && b < ctx->graph.nbuckets; b++)
        free(ctx->graph.buckets[b].sub);
    for (int g = 0; ctx->graph.groups && g < ctx->graph.ngroups; g++) {
        free(ctx->graph.groups[g].op.blocks);
        free(ctx->graph.groups[g].op.deps);
    }
    free(ctx->graph.buckets);
    free(ctx->graph.groups);
    free(ctx->graph.ops);
    free(ctx->graph.units);
    ctx->graph.units = NULL;
    ctx->graph.nunits = 0;
    ctx->graph.buckets = NULL;
    ctx->graph.groups = NULL;
    ctx->graph.ops = NULL;
}

/*
 * Compression of float32 gradients (DEAR_COMPRESS, DEAR_COMPRESS_AG, DEAR_COMPRESS_EF,
 * dear_set_compress): the format each phase travels in (bf16, fp16, int8), fixed at commit and
 * the same on every rank. The collectives do the rest (collectives/coll.h, "Compression"):
 * buckets.c sets the formats on the float32 buckets' and groups' collectives, and the planners
 * price the bytes that travel (dear_compress_profile). Error feedback keeps, per rank and
 * element, what rounding this rank's gradient to the reduce-scatter's 16-bit format dropped, and
 * adds it to the next iteration's gradient right before its reduce-scatter (the bucket's
 * `before`, once its buffer is filled), so that the rounding error does not accumulate over
 * iterations. int8 blocks are cut by the collective (per shard), so its error feedback lives in
 * the collectives: a residual per element of each dense bucket (resid8) that the reduce-scatter
 * fills at the other ranks' chunks and the all-gather at this rank's shard; on by default.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/check.h"
#include "base/mpi_check.h"
#include "base/params.h"
#include "base/util.h"
#include "cuda/cuda.h"
#include "runtime/rt.h"

static int set_compress_claimed(dear_ctx_t *ctx, dear_compress_t rs, dear_compress_t ag, int error_feedback)
{
    DEAR_ARG_CHECK(ctx != NULL, "dear_set_compress: ctx is NULL");
    DEAR_ARG_CHECK((unsigned)rs < DEAR_COMPRESS_COUNT && (unsigned)ag < DEAR_COMPRESS_COUNT,
                   "dear_set_compress: format %d for the reduce-scatters, %d for the all-gathers; accepted: "
                   "DEAR_COMPRESS_NONE (0), DEAR_COMPRESS_BF16 (1), DEAR_COMPRESS_FP16 (2), DEAR_COMPRESS_INT8 (3)",
                   (int)rs, (int)ag);
    DEAR_ARG_CHECK(error_feedback == 0 || error_feedback == 1,
                   "dear_set_compress: error_feedback %d; accepted: 0 or 1", error_feedback);
    if (ctx->committed) {
        DEAR_ERROR("api", "dear_set_compress: the context is committed; set the formats before dear_commit (the "
                          "plan is made for them)");
        return DEAR_ERR_STATE;
    }
    ctx->comp.set = 1;
    ctx->comp.rs = rs;
    ctx->comp.ag = ag;
    ctx->comp.ef = error_feedback;
    return DEAR_OK;
}

int dear_set_compress(dear_ctx_t *ctx, dear_compress_t rs, dear_compress_t ag, int error_feedback)
{
    DEAR_CLAIMED(ctx, "dear_set_compress", set_compress_claimed(ctx, rs, ag, error_feedback));
}

int dear_compress_int8_refused(int deterministic, int nccl, char *msg, size_t len)
{
    if (deterministic)
        snprintf(msg, len, "int8 compression (DEAR_COMPRESS, DEAR_COMPRESS_AG) and the deterministic mode "
                           "(DEAR_DETERMINISTIC): int8 blocks are cut per shard of each bucket, so a sum depends "
                           "on the plan; accepted: bf16 or fp16 with it, or int8 without it");
    else if (nccl)
        snprintf(msg, len, "int8 compression (DEAR_COMPRESS, DEAR_COMPRESS_AG) and CUDA memory on the NCCL "
                           "transport with an NCCL older than 2.28: int8 chunks travel by ncclAlltoAll, which it "
                           "lacks; accepted: bf16 or fp16 there, int8 with NCCL 2.28 or newer, or with the gradients "
                           "staged (DEAR_CUDA_TRANSPORT=staged)");
    return deterministic || nccl;
}

/* The formats and error feedback must be the same on every rank: message sizes depend on them. */
static int agree(dear_ctx_t *ctx)
{
    dear_compress_ctl_t *c = &ctx->comp;
    int v[6] = { (int)c->rs, -(int)c->rs, (int)c->ag, -(int)c->ag, c->ef, -c->ef }, most[6];
    DEAR_MPI_CHECK(MPI_Allreduce(v, most, 6, MPI_INT, MPI_MAX, ctx->cm.comm));
    static const char *const what[3] = { "reduce-scatter format (DEAR_COMPRESS)", "all-gather format (DEAR_COMPRESS_AG)",
                                         "error feedback (DEAR_COMPRESS_EF)" };
    for (int i = 0; i < 3; i++)
        if (most[2 * i] != -most[2 * i + 1]) {
            DEAR_ERROR("api", "dear_commit: the %s differs between ranks (this rank: %s); set the same on every rank "
                              "(mpirun -x DEAR_COMPRESS ...) or pass the same to dear_set_compress",
                       what[i], i == 0 ? dear_compress_name(c->rs) : i == 1 ? dear_compress_name(c->ag) : c->ef ? "1" : "0");
            return DEAR_ERR_MISMATCH;
        }
    return DEAR_OK;
}

/* The formats: dear_set_compress's, or the environment's; the same on every rank. */
static int compress_decide(dear_ctx_t *ctx)
{
    dear_compress_ctl_t *c = &ctx->comp;
    if (!c->set) {
        c->rs = (dear_compress_t)dear_param_enum(DEAR_P_COMPRESS);
        long ag = dear_param_enum(DEAR_P_COMPRESS_AG); /* same|none|bf16|fp16|int8 */
        c->ag = ag == 0 ? c->rs : (dear_compress_t)(ag - 1);
        /* int8 drops far more than 16 bits do: its feedback is on unless asked off. */
        int int8 = c->rs == DEAR_COMPRESS_INT8 || c->ag == DEAR_COMPRESS_INT8;
        c->ef = dear_param_from_env(DEAR_P_COMPRESS_EF) || !int8 ? (int)dear_param_int(DEAR_P_COMPRESS_EF) : 1;
    }
    return agree(ctx);
}

static int compress_is_on(const dear_ctx_t *ctx)
{
    return ctx->comp.rs != DEAR_COMPRESS_NONE || ctx->comp.ag != DEAR_COMPRESS_NONE;
}

/* Sharded, the all-gathers carry parameters, not gradients: rounding them would round the model
 * itself every iteration. */
static void compress_yield(dear_ctx_t *ctx, dear_feat_t other)
{
    (void)other;
    ctx->comp.ag = DEAR_COMPRESS_NONE;
}

static int compress_setup(dear_ctx_t *ctx)
{
    dear_compress_ctl_t *c = &ctx->comp;
    if (c->ef && c->rs == DEAR_COMPRESS_NONE && c->ag != DEAR_COMPRESS_INT8) {
        DEAR_INFO("compress", "error feedback is off: the reduce-scatters are not compressed");
        c->ef = 0;
    }
    if (c->rs == DEAR_COMPRESS_NONE && c->ag == DEAR_COMPRESS_NONE)
        return DEAR_OK;
    int other = 0, first = -1;
    for (int t = 0; t < ctx->reg.ntensors; t++)
        if (ctx->reg.tensors[t].dtype != DEAR_FLOAT32) {
            other++;
            first = first < 0 ? t : first;
        }
    if (other > 0 && ctx->cm.rank == 0)
        DEAR_INFO("compress", "%d tensor(s) not float32 travel as they are (compression applies to float32; the "
                              "first, '%s', is %s)",
                  other, ctx->reg.tensors[first].name, dear_dtype_name(ctx->reg.tensors[first].dtype));
    if (ctx->cm.rank == 0)
        DEAR_INFO("compress", "float32 gradients travel as %s in the reduce-scatters (all-reduces), %s in the "
                              "all-gathers%s",
                  dear_compress_name(c->rs), dear_compress_name(c->ag), c->ef ? ", with error feedback" : "");
    return DEAR_OK;
}

/* Error feedback: a residual per element of every float32 tensor, zero at first, in the memory
 * of the buckets' buffers (the device's under NCCL, host memory when staged). */
static int compress_mem(dear_ctx_t *ctx)
{
    dear_compress_ctl_t *c = &ctx->comp;
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    char msg[512];
    int nccl = !(mo->flags & DEAR_MEM_F_HOST_ACCESS) && !dear_nccl_alltoall();
    if ((c->rs == DEAR_COMPRESS_INT8 || c->ag == DEAR_COMPRESS_INT8) &&
        dear_compress_int8_refused(dear_determ_on(ctx), nccl, msg, sizeof msg)) {
        DEAR_ERROR("api", "dear_commit: %s", msg);
        return DEAR_ERR_UNSUPPORTED;
    }
    /* The 16-bit formats' residual is per tensor; int8's per bucket (compress_graph). */
    if (!c->ef || ctx->cm.size < 2 || (c->rs != DEAR_COMPRESS_BF16 && c->rs != DEAR_COMPRESS_FP16))
        return DEAR_OK;
    if (mo->feedback == NULL) {
        DEAR_ERROR("api", "dear_commit: error feedback (DEAR_COMPRESS_EF) on %s memory, whose row has no feedback "
                          "kernel; turn it off or stage the gradients (DEAR_CUDA_TRANSPORT=staged)",
                   mo->name);
        return DEAR_ERR_UNSUPPORTED;
    }
    size_t n = 0;
    DEAR_ALLOC_CHECK(c->resid_off, malloc(sizeof(size_t) * (size_t)ctx->reg.ntensors),
                     sizeof(size_t) * (size_t)ctx->reg.ntensors);
    for (int t = 0; t < ctx->reg.ntensors; t++) {
        const dear_tensor_t *tt = &ctx->reg.tensors[t];
        c->resid_off[t] = tt->dtype == DEAR_FLOAT32 ? n : SIZE_MAX;
        n += tt->dtype == DEAR_FLOAT32 ? tt->count : 0;
    }
    if (n == 0)
        return DEAR_OK;
    DEAR_CHECK(mo->alloc(n * sizeof(float), 0, (void **)&c->resid));
    return mo->zero(dear_rt_work_queue(ctx), c->resid, n * sizeof(float));
}

static void resid8_free(dear_ctx_t *ctx)
{
    if (ctx->comp.resid8 != NULL)
        dear_rt_work_ops(ctx)->release(ctx->comp.resid8, 0);
    ctx->comp.resid8 = NULL;
}

static void compress_free(dear_ctx_t *ctx)
{
    dear_compress_ctl_t *c = &ctx->comp;
    if (c->resid != NULL)
        dear_rt_work_ops(ctx)->release(c->resid, 0);
    free(c->resid_off);
    resid8_free(ctx);
    c->resid = NULL;
    c->resid_off = NULL;
}

/* The bucket's buffer is filled: each unit's gradient gets its residual added and is rounded to
 * the wire format here, so the collective's own rounding of it is exact; the residual keeps the
 * difference. On the buffers' queue (the progress thread, for host buffers). */
static void feedback_before(dear_ctx_t *ctx, dear_op_t *op)
{
    const dear_bucket_t *b = &ctx->graph.buckets[op->index];
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    dear_dtype_t t = dear_compress_dtype(ctx->comp.rs);
    for (int u = b->u0; u < b->u1; u++) {
        size_t n = dear_unit_ccount(&ctx->graph, &ctx->reg, u);
        const dear_rt_unit_t *un = &ctx->graph.units[u];
        if (n == 0)
            continue;
        float *v = (float *)dear_unit_vec(ctx, u, 0), *e = ctx->comp.resid + ctx->comp.resid_off[un->tensor] + un->eoff;
        if (mo->feedback(dear_rt_work_queue(ctx), t, v, e, n) != DEAR_OK)
            DEAR_ERROR("compress", "error feedback on bucket %d failed (above); its gradients travel without it",
                       op->index);
    }
}

/* The residual of the int8 block holding buf, in the bucket whose vector holds it (NULL: none). */
static float *resid8_of(const dear_ctx_t *ctx, const size_t *at, const void *buf)
{
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        const dear_bucket_t *bk = &ctx->graph.buckets[b];
        const char *p = buf, *lo = bk->buf;
        if (at[b] != SIZE_MAX && p >= lo && p < lo + bk->count * sizeof(float))
            return ctx->comp.resid8 + at[b] + (size_t)(p - lo) / sizeof(float);
    }
    return NULL;
}

/* A multi-block collective's residuals: every block's, or none when one lies in no dense bucket
 * (the collective takes all or none). */
static void blocks_ef(const dear_ctx_t *ctx, const size_t *at, dear_coll_block_t *blk, int n)
{
    int all = 1;
    for (int i = 0; i < n && all; i++)
        all = resid8_of(ctx, at, blk[i].buf) != NULL;
    for (int i = 0; i < n && all; i++)
        blk[i].ef = resid8_of(ctx, at, blk[i].buf);
}

/* int8 error feedback: a residual per element of every dense float32 bucket, zero at each graph
 * build (a plan switch loses one iteration's residual, not more), handed to the buckets'
 * collectives and to the all-gathers' blocks that gather them. */
static int resid8_graph(dear_ctx_t *ctx)
{
    dear_compress_ctl_t *c = &ctx->comp;
    int rs8 = c->rs == DEAR_COMPRESS_INT8, ag8 = c->ag == DEAR_COMPRESS_INT8;
    if (!c->ef || ctx->cm.size < 2 || !(rs8 || ag8))
        return DEAR_OK;
    size_t n = 0, nb = (size_t)ctx->graph.nbuckets + 1, *at = NULL;
    int rc = DEAR_OK;
    DEAR_ALLOC_GOTO(at, malloc(nb * sizeof(size_t)), nb * sizeof(size_t), rc, out);
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        const dear_bucket_t *bk = &ctx->graph.buckets[b];
        int dense = bk->dtype == DEAR_FLOAT32 && bk->sparse_block == 0;
        at[b] = dense ? n : SIZE_MAX;
        n += dense ? bk->count : 0;
    }
    if (n == 0)
        goto out;
    /* In the buffers' memory, zeroed in order on their queue: the device's under NCCL. */
    const dear_mem_ops_t *mo = dear_rt_work_ops(ctx);
    rc = mo->alloc(n * sizeof(float), 0, (void **)&c->resid8);
    if (rc == DEAR_OK)
        rc = mo->zero(dear_rt_work_queue(ctx), c->resid8, n * sizeof(float));
    if (rc != DEAR_OK)
        goto out;
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        int ar = bk->op.kind == DEAR_COLL_ALLREDUCE;
        if (at[b] == SIZE_MAX || !(rs8 || (ar && ag8)))
            continue;
        bk->op.args.ef = c->resid8 + at[b];
        blocks_ef(ctx, at, bk->sub, bk->nsub);
    }
    for (int g = 0; g < ctx->graph.ngroups && ag8; g++) {
        dear_op_t *op = &ctx->graph.groups[g].op;
        if (op->args.dtype == DEAR_FLOAT32)
            blocks_ef(ctx, at, op->blocks, op->args.nblocks);
    }
out:
    free(at);
    return rc;
}

static void compress_graph_free(dear_ctx_t *ctx) { resid8_free(ctx); }

static int compress_graph(dear_ctx_t *ctx)
{
    DEAR_CHECK(resid8_graph(ctx));
    if (ctx->comp.resid == NULL)
        return DEAR_OK;
    for (int b = 0; b < ctx->graph.nbuckets; b++) {
        dear_bucket_t *bk = &ctx->graph.buckets[b];
        /* Sparse buckets keep their zeros: a residual would make every touched row travel. */
        if (bk->dtype == DEAR_FLOAT32 && bk->sparse_block == 0)
            DEAR_CHECK(dear_op_hook(&bk->op, feedback_before, NULL));
    }
    return DEAR_OK;
}

void dear_compress_args(const dear_ctx_t *ctx, dear_op_t *op)
{
    if (op->args.dtype != DEAR_FLOAT32)
        return;
    op->args.compress = op->kind == DEAR_COLL_ALLGATHER ? ctx->comp.ag : ctx->comp.rs;
    op->args.compress_ag = ctx->comp.ag;
}

void dear_compress_formats(const dear_ctx_t *ctx, dear_compress_t *rs, dear_compress_t *ag)
{
    *rs = ctx->comp.rs;
    *ag = ctx->comp.ag;
}

static void compress_profile(const dear_ctx_t *ctx, dear_profile_t *prof)
{
    for (int t = 0; t < ctx->reg.ntensors && t < prof->ntensors; t++)
        if (ctx->reg.tensors[t].dtype == DEAR_FLOAT32)
            dear_prof_set_compress(prof, t, ctx->comp.rs, ctx->comp.ag);
}

static const dear_feature_rule_t compress_rules[] = {
    { DEAR_RULE_YIELDS, DEAR_FEAT_SHARD, DEAR_WHEN_ALWAYS,
      "the all-gathers carry parameters, which travel uncompressed (DEAR_COMPRESS_AG is not used)" },
    { DEAR_RULE_END, 0, 0, NULL },
};

const dear_feature_t dear_feature_compress = {
    .after = DEAR_FEAT_BIT(SHARD) | DEAR_FEAT_BIT(SPARSE),
    .rules = compress_rules,
    .decide = compress_decide,
    .on = compress_is_on,
    .yield = compress_yield,
    .setup = compress_setup,
    .mem = compress_mem,
    .graph = compress_graph,
    .graph_free = compress_graph_free,
    .profile = compress_profile,
    .free = compress_free,
};

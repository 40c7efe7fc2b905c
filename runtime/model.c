/*
 * The model as the runtime sees it: the registry check across ranks at commit, the plan
 * (planner chosen by DEAR_FUSION, decided on rank 0 and broadcast), and what the plan turns
 * into: buckets with their vectors (the gradients themselves when a bucket's tensors lie back
 * to back in memory, else a fusion buffer), all-gather groups with their blocks, and the
 * operations of one iteration in the fixed order every rank runs them.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fusion/planfile.h"
#include "runtime/check.h"
#include "runtime/params.h"
#include "runtime/rt.h"
#include "runtime/util.h"

/* ---- registry check across ranks ---- */

typedef struct {
    char name[DEAR_NAME_MAX + 1];
    int64_t layer;
    int64_t count;
    int64_t dtype;
} wire_tensor_t;

static void wire_fill(const dear_ctx_t *ctx, int i, wire_tensor_t *w)
{
    memset(w, 0, sizeof *w);
    if (i < 0 || i >= ctx->ntensors) {
        w->dtype = -1; /* marks "no tensor at this index" */
        return;
    }
    memcpy(w->name, ctx->tensors[i].name, sizeof w->name);
    w->layer = ctx->tensors[i].layer;
    w->count = (int64_t)ctx->tensors[i].count;
    w->dtype = ctx->tensors[i].dtype;
}

static void wire_describe(const wire_tensor_t *w, char *buf, size_t len)
{
    if (w->dtype < 0)
        snprintf(buf, len, "no tensor");
    else
        snprintf(buf, len, "'%s' (layer %lld, %lld x %s)", w->name, (long long)w->layer, (long long)w->count,
                 dear_dtype_name((dear_dtype_t)w->dtype));
}

/* First field where a and b differ, with both values as text; NULL if equal. */
static const char *wire_diff(const wire_tensor_t *a, const wire_tensor_t *b, char *va, char *vb, size_t len)
{
    if ((a->dtype < 0) != (b->dtype < 0)) {
        wire_describe(a, va, len);
        wire_describe(b, vb, len);
        return "presence";
    }
    if (a->dtype < 0)
        return NULL;
    if (strncmp(a->name, b->name, sizeof a->name) != 0) {
        snprintf(va, len, "'%s'", a->name);
        snprintf(vb, len, "'%s'", b->name);
        return "name";
    }
    if (a->layer != b->layer) {
        snprintf(va, len, "%lld", (long long)a->layer);
        snprintf(vb, len, "%lld", (long long)b->layer);
        return "layer";
    }
    if (a->count != b->count) {
        snprintf(va, len, "%lld", (long long)a->count);
        snprintf(vb, len, "%lld", (long long)b->count);
        return "count";
    }
    if (a->dtype != b->dtype) {
        snprintf(va, len, "%s", dear_dtype_name((dear_dtype_t)a->dtype));
        snprintf(vb, len, "%s", dear_dtype_name((dear_dtype_t)b->dtype));
        return "dtype";
    }
    return NULL;
}

/* Rank 0's table goes to everyone (its size first, so a rank with a different count never
 * waits for data that is not coming); each rank finds its first difference; one MIN
 * all-reduce agrees on the first differing index; an all-gather tells who differs there and
 * the lowest such rank broadcasts its entry, so every rank prints the same message. */
int dear_model_check(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    long long n0 = ctx->ntensors;
    wire_tensor_t *table = NULL, mine, theirs;
    int *differs = NULL;
    char va[160], vb[160], ranks[256];

    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&n0, 1, MPI_LONG_LONG, 0, ctx->comm), rc, out);
    size_t bytes = sizeof *table * (size_t)(n0 > 0 ? n0 : 1);
    DEAR_ALLOC_GOTO(table, malloc(bytes), bytes, rc, out);
    if (ctx->rank == 0)
        for (int i = 0; i < n0; i++)
            wire_fill(ctx, i, &table[i]);
    if (n0 > 0)
        DEAR_MPI_CHECK_GOTO(MPI_Bcast(table, (int)(n0 * (long long)sizeof *table), MPI_BYTE, 0, ctx->comm), rc, out);

    int first = INT_MAX;
    long long upto = n0 < ctx->ntensors ? n0 : ctx->ntensors;
    for (int i = 0; i < upto && first == INT_MAX; i++) {
        wire_fill(ctx, i, &mine);
        if (wire_diff(&table[i], &mine, va, vb, sizeof va))
            first = i;
    }
    if (first == INT_MAX && n0 != ctx->ntensors)
        first = (int)upto;
    int agreed = INT_MAX;
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&first, &agreed, 1, MPI_INT, MPI_MIN, ctx->comm), rc, out);
    if (agreed == INT_MAX)
        goto out;

    /* Everyone compares its own entry at the agreed index with rank 0's. */
    wire_tensor_t ref;
    if (agreed < n0)
        ref = table[agreed];
    else
        wire_fill(ctx, -1, &ref);
    wire_fill(ctx, agreed, &mine);
    int me_differs = wire_diff(&ref, &mine, va, vb, sizeof va) != NULL;
    DEAR_ALLOC_GOTO(differs, malloc(sizeof *differs * (size_t)ctx->size), sizeof *differs * (size_t)ctx->size, rc,
                    out);
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(&me_differs, 1, MPI_INT, differs, 1, MPI_INT, ctx->comm), rc, out);
    int witness = -1;
    size_t used = 0;
    ranks[0] = '\0';
    for (int r = 0; r < ctx->size; r++) {
        if (!differs[r])
            continue;
        if (witness < 0)
            witness = r;
        if (used + 16 < sizeof ranks)
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? "," : "", r);
        else if (used + 4 < sizeof ranks && ranks[used - 1] != '.')
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "...");
    }
    if (witness < 0) {
        DEAR_ERROR("commit", "dear_commit: ranks disagree on the first differing tensor index %d but none "
                             "reports a difference there",
                   agreed);
        rc = DEAR_ERR_INTERNAL;
        goto out;
    }
    theirs = mine;
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&theirs, (int)sizeof theirs, MPI_BYTE, witness, ctx->comm), rc, out);
    const char *field = wire_diff(&ref, &theirs, va, vb, sizeof va);
    if (field && strcmp(field, "presence") == 0) {
        DEAR_ERROR("commit", "dear_commit: registered tensors differ across ranks at tensor index %d: rank 0 "
                             "registered %lld tensor(s) and has %s there, rank %d has %s; ranks differing from "
                             "rank 0 there: %s",
                   agreed, n0, va, witness, vb, ranks);
    } else {
        char desc[160];
        wire_describe(&ref, desc, sizeof desc);
        DEAR_ERROR("commit", "dear_commit: registered tensors differ across ranks at tensor index %d (rank 0: "
                             "%s): field %s is %s on rank 0 but %s on rank %d; ranks differing from rank 0 "
                             "there: %s",
                   agreed, desc, field ? field : "?", va, vb, witness, ranks);
    }
    rc = DEAR_ERR_MISMATCH;
out:
    free(table);
    free(differs);
    return rc;
}

/* ---- plan ---- */

int dear_tensor_table(const dear_ctx_t *ctx, dear_tensor_desc_t **desc, const char ***names)
{
    int rc = DEAR_OK, n = ctx->ntensors;
    size_t nd = sizeof **desc * (size_t)(n ? n : 1), nn = sizeof **names * (size_t)(n ? n : 1);
    *desc = NULL;
    *names = NULL;
    DEAR_ALLOC_GOTO(*desc, malloc(nd), nd, rc, err);
    DEAR_ALLOC_GOTO(*names, malloc(nn), nn, rc, err);
    for (int i = 0; i < n; i++) {
        (*desc)[i].bytes = ctx->tensors[i].bytes;
        (*desc)[i].layer = ctx->tensors[i].layer;
        (*names)[i] = ctx->tensors[i].name;
    }
    return DEAR_OK;
err:
    free(*desc);
    *desc = NULL;
    return rc;
}

static int make_plan(dear_ctx_t *ctx, dear_plan_t *plan)
{
    int rc = DEAR_OK, n = ctx->ntensors;
    dear_tensor_desc_t *desc = NULL;
    const char **names = NULL;
    DEAR_CHECK_GOTO(dear_tensor_table(ctx, &desc, &names), rc, out);
    const char *pfile = dear_param_string(DEAR_P_PLAN_FILE);
    if (pfile && pfile[0] && ctx->sched != DEAR_SCHED_SYNC) {
        /* A fixed plan (dear-plan's output), checked against the registered tensors. */
        rc = dear_planfile_load(pfile, n, desc, names, plan);
        if (rc != DEAR_OK)
            DEAR_ERROR("plan", "DEAR_PLAN_FILE=%s: cannot use this plan (%s); see the message above", pfile,
                       dear_status_string(rc));
        else if (!plan->planner[0])
            snprintf(plan->planner, sizeof plan->planner, "file");
        goto out;
    }
    if (ctx->sched == DEAR_SCHED_SYNC) {
        /* One all-reduce of everything: the baseline without overlap. */
        int first[2] = { 0, n };
        DEAR_CHECK_GOTO(dear_partition_set(&plan->rs, n, 1, first), rc, out);
        DEAR_CHECK_GOTO(dear_partition_set(&plan->ag, n, 1, first), rc, out);
        plan->ntensors = n;
        snprintf(plan->planner, sizeof plan->planner, "sync");
        goto out;
    }
    const char *fusion = dear_param_string(DEAR_P_FUSION);
    if (strcmp(fusion, "none") == 0) {
        rc = dear_plan_none(plan, n, desc);
    } else if (strcmp(fusion, "threshold") == 0 || ctx->online) {
        /* Model-driven planners need the measured profile: until the warm-up iterations have
         * given one (planning.c), the threshold plan runs. */
        rc = dear_plan_threshold(plan, n, desc, (size_t)dear_param_int(DEAR_P_FUSION_THRESHOLD));
        if (rc == DEAR_OK && ctx->online)
            snprintf(plan->planner, sizeof plan->planner, "threshold(warm-up)");
    } else {
        /* A model-driven planner on one rank has nothing to plan: no communication at all. */
        rc = dear_plan_threshold(plan, n, desc, (size_t)dear_param_int(DEAR_P_FUSION_THRESHOLD));
    }
    if (rc != DEAR_OK)
        DEAR_ERROR("plan", "planner %s failed for %d tensors: %s", fusion, n, dear_status_string(rc));
out:
    free(desc);
    free(names);
    return rc;
}

/* Rank 0 plans and broadcasts, so a planner with any rank-dependent behaviour (timings, floating
 * point) still yields one plan. The verdict travels with it, so a failing planner fails everywhere. */
static int bcast_partition(dear_ctx_t *ctx, dear_partition_t *p)
{
    int rc = DEAR_OK, ng = p->ngroups;
    int *first = NULL;
    DEAR_MPI_CHECK(MPI_Bcast(&ng, 1, MPI_INT, 0, ctx->comm));
    DEAR_ALLOC_GOTO(first, malloc(sizeof(int) * (size_t)(ng + 1)), sizeof(int) * (size_t)(ng + 1), rc, out);
    if (ctx->rank == 0)
        memcpy(first, p->first, sizeof(int) * (size_t)(ng + 1));
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(first, ng + 1, MPI_INT, 0, ctx->comm), rc, out);
    if (ctx->rank != 0)
        rc = dear_partition_set(p, ctx->ntensors, ng, first);
out:
    free(first);
    return rc;
}

int dear_model_bcast_plan(dear_ctx_t *ctx, dear_plan_t *plan, int rc0)
{
    int rc = rc0;
    DEAR_MPI_CHECK(MPI_Bcast(&rc, 1, MPI_INT, 0, ctx->comm));
    if (rc != DEAR_OK) {
        if (ctx->rank != 0)
            DEAR_ERROR("plan", "rank 0 could not make a plan (%s); see its message", dear_status_string(rc));
        return rc;
    }
    DEAR_MPI_CHECK(MPI_Bcast(plan->planner, (int)sizeof plan->planner, MPI_CHAR, 0, ctx->comm));
    DEAR_CHECK(bcast_partition(ctx, &plan->rs));
    DEAR_CHECK(bcast_partition(ctx, &plan->ag));
    DEAR_MPI_CHECK(MPI_Bcast(&plan->ag_early, 1, MPI_INT, 0, ctx->comm));
    plan->ntensors = ctx->ntensors;
    char msg[256];
    if (dear_plan_validate(plan, ctx->ntensors, msg, sizeof msg) != DEAR_OK) {
        DEAR_ERROR("plan", "the plan is malformed: %s", msg);
        return DEAR_ERR_INTERNAL;
    }
    return DEAR_OK;
}

static int plan_agree(dear_ctx_t *ctx)
{
    int rc = DEAR_OK;
    if (ctx->rank == 0)
        rc = make_plan(ctx, &ctx->plan);
    return dear_model_bcast_plan(ctx, &ctx->plan, rc);
}

/* A collective carries one element type: cut every group where the type changes. The result
 * is the same on every rank because the registries are. */
static int split_by_dtype(const dear_ctx_t *ctx, const dear_partition_t *in, int **first_out, int *ng_out)
{
    int rc = DEAR_OK, n = ctx->ntensors, ng = 0;
    int *first = NULL;
    DEAR_ALLOC_GOTO(first, malloc(sizeof(int) * (size_t)(n + 1)), sizeof(int) * (size_t)(n + 1), rc, err);
    for (int g = 0; g < in->ngroups; g++)
        for (int t = in->first[g]; t < in->first[g + 1]; t++)
            if (t == in->first[g] || ctx->tensors[t].dtype != ctx->tensors[t - 1].dtype)
                first[ng++] = t;
    first[ng] = n;
    *first_out = first;
    *ng_out = ng;
    return DEAR_OK;
err:
    return rc;
}

static void op_layers(dear_ctx_t *ctx, dear_op_t *op, int t0, int t1)
{
    op->layer_lo = ctx->tensors[t0].layer;
    op->layer_hi = ctx->tensors[t1 - 1].layer;
}

/* Buckets, groups, fusion buffers and the operation order of ctx->plan. */
static int build_ops(dear_ctx_t *ctx)
{
    int rc = DEAR_OK, *first = NULL, ng = 0;
    size_t bytes;

    if (DEAR_LOG_ON(DEAR_LOG_DEBUG) && ctx->rank == 0)
        dear_plan_print(stderr, &ctx->plan, NULL);

    /* buckets */
    DEAR_CHECK_GOTO(split_by_dtype(ctx, &ctx->plan.rs, &first, &ng), rc, out);
    DEAR_ALLOC_GOTO(ctx->buckets, calloc((size_t)ng, sizeof *ctx->buckets), sizeof *ctx->buckets * (size_t)ng, rc, out);
    ctx->nbuckets = ng;
    int nfused = 0;
    for (int b = 0; b < ng; b++) {
        dear_bucket_t *bk = &ctx->buckets[b];
        bk->t0 = first[b];
        bk->t1 = first[b + 1];
        bk->dtype = ctx->tensors[bk->t0].dtype;
        int contiguous = 1;
        for (int t = bk->t0; t < bk->t1; t++) {
            dear_tensor_t *tt = &ctx->tensors[t];
            tt->bucket = b;
            tt->off = bk->count;
            bk->count += tt->count;
            if (t > bk->t0 && (char *)ctx->tensors[t - 1].grad + ctx->tensors[t - 1].bytes != (char *)tt->grad)
                contiguous = 0;
        }
        bk->bytes = bk->count * dear_dtype_size(bk->dtype);
        if (contiguous) {
            bk->buf = ctx->tensors[bk->t0].grad;
        } else {
            DEAR_ALLOC_GOTO(bk->buf, malloc(bk->bytes), bk->bytes, rc, out);
            bk->fused = 1;
            nfused++;
        }
        dear_op_t *op = &bk->op;
        op->kind = ctx->sched == DEAR_SCHED_DEAR ? DEAR_COLL_REDUCE_SCATTER : DEAR_COLL_ALLREDUCE;
        op->index = b;
        op->bytes = bk->bytes;
        op->done_iter = -1;
        op_layers(ctx, op, bk->t0, bk->t1);
        op->args.op = op->kind;
        op->args.algo = DEAR_ALGO_AUTO;
        op->args.dtype = bk->dtype;
        op->args.comm = ctx->comm;
        op->args.topo = ctx->coll_topo;
        op->args.scale = 1.0 / ctx->size; /* averaging fused into the reduction */
        op->args.sendbuf = NULL;          /* in place */
        op->args.recvbuf = bk->buf;
        op->args.count = bk->count;
    }
    free(first);
    first = NULL;

    /* all-gather groups (schedule dear); the plan's early ones are those from its first early
     * group's first tensor on (cutting by type only splits groups) */
    int early_t0 = ctx->plan.ag_early > 0 ? ctx->plan.ag.first[ctx->plan.ag.ngroups - ctx->plan.ag_early]
                                          : ctx->ntensors;
    ctx->ngroups_early = 0;
    if (ctx->sched == DEAR_SCHED_DEAR) {
        DEAR_CHECK_GOTO(split_by_dtype(ctx, &ctx->plan.ag, &first, &ng), rc, out);
        DEAR_ALLOC_GOTO(ctx->groups, calloc((size_t)ng, sizeof *ctx->groups), sizeof *ctx->groups * (size_t)ng, rc,
                        out);
        ctx->ngroups = ng;
        for (int g = 0; g < ng; g++) {
            dear_group_t *gr = &ctx->groups[g];
            gr->t0 = first[g];
            gr->t1 = first[g + 1];
            dear_op_t *op = &gr->op;
            int b0 = ctx->tensors[gr->t0].bucket, b1 = ctx->tensors[gr->t1 - 1].bucket;
            int nb = b1 - b0 + 1;
            DEAR_ALLOC_GOTO(op->blocks, calloc((size_t)nb, sizeof *op->blocks), sizeof *op->blocks * (size_t)nb, rc,
                            out);
            DEAR_ALLOC_GOTO(op->deps, calloc((size_t)nb, sizeof *op->deps), sizeof *op->deps * (size_t)nb, rc, out);
            for (int b = b0; b <= b1; b++) {
                const dear_bucket_t *bk = &ctx->buckets[b];
                int lo_t = gr->t0 > bk->t0 ? gr->t0 : bk->t0;
                int hi_t = gr->t1 < bk->t1 ? gr->t1 : bk->t1;
                dear_coll_block_t *blk = &op->blocks[b - b0];
                blk->buf = bk->buf;
                blk->count = bk->count;
                blk->lo = ctx->tensors[lo_t].off;
                blk->hi = ctx->tensors[hi_t - 1].off + ctx->tensors[hi_t - 1].count;
                op->bytes += (blk->hi - blk->lo) * dear_dtype_size(bk->dtype);
                op->deps[b - b0] = (dear_op_t *)&bk->op;
            }
            op->ndeps = nb;
            gr->early = gr->t0 >= early_t0;
            ctx->ngroups_early += gr->early;
            op->kind = DEAR_COLL_ALLGATHER;
            op->index = g;
            op->done_iter = -1;
            op_layers(ctx, op, gr->t0, gr->t1);
            op->args.op = DEAR_COLL_ALLGATHER;
            op->args.algo = DEAR_ALGO_AUTO;
            op->args.dtype = ctx->tensors[gr->t0].dtype;
            op->args.comm = ctx->comm;
            op->args.topo = ctx->coll_topo;
            op->args.scale = 1.0;
            op->args.nblocks = nb;
            op->args.blocks = op->blocks;
        }
        free(first);
        first = NULL;
    }

    /* One iteration's operations in their fixed order: buckets as backward completes them
     * (last first), each followed by the early all-gather groups whose data it completes (the
     * bucket holding a group's first tensor is the last of its dependencies to finish; groups
     * last first), then the other all-gathers in forward order. The simulator assumes exactly
     * this order (fusion/sim.h). */
    ctx->nops = ctx->nbuckets + ctx->ngroups;
    bytes = sizeof *ctx->ops * (size_t)ctx->nops;
    DEAR_ALLOC_GOTO(ctx->ops, malloc(bytes), bytes, rc, out);
    int pos = 0, ge = ctx->ngroups - 1;
    for (int b = ctx->nbuckets - 1; b >= 0; b--) {
        dear_bucket_t *bk = &ctx->buckets[b];
        bk->early_hi = ge;
        bk->op.pos = pos;
        ctx->ops[pos++] = &bk->op;
        for (; ge >= 0 && ctx->groups[ge].early && ctx->tensors[ctx->groups[ge].t0].bucket == b; ge--) {
            ctx->groups[ge].op.pos = pos;
            ctx->ops[pos++] = &ctx->groups[ge].op;
        }
        bk->early_lo = ge + 1;  /* the bucket's early groups: early_lo..early_hi (none if lo > hi) */
    }
    for (int g = 0; g < ctx->ngroups; g++)
        if (!ctx->groups[g].early) {
            ctx->groups[g].op.pos = pos;
            ctx->ops[pos++] = &ctx->groups[g].op;
        }
    DEAR_INFO("plan", "planner %s: %d bucket(s) (%d with a fusion buffer, %d zero-copy), %d all-gather group(s) "
                      "(%d during backward), %d tensor(s) in %d layer(s)",
              ctx->plan.planner, ctx->nbuckets, nfused, ctx->nbuckets - nfused, ctx->ngroups, ctx->ngroups_early,
              ctx->ntensors, ctx->nlayers);
out:
    free(first);
    return rc;
}

int dear_model_build(dear_ctx_t *ctx)
{
    DEAR_CHECK(plan_agree(ctx));
    return build_ops(ctx);
}

static void ops_free(dear_ctx_t *ctx);

int dear_model_rebuild(dear_ctx_t *ctx, const dear_plan_t *plan)
{
    dear_plan_t copy = { 0 };
    DEAR_CHECK(dear_plan_copy(&copy, plan));
    ops_free(ctx);
    dear_plan_free(&ctx->plan);
    ctx->plan = copy;
    ctx->nbuckets = ctx->ngroups = ctx->nops = 0;
    DEAR_CHECK(build_ops(ctx));
    for (int g = 0; g < ctx->ngroups; g++)
        ctx->groups[g].unpacked = 1;
    return DEAR_OK;
}

void dear_model_free(dear_ctx_t *ctx)
{
    ops_free(ctx);
    dear_plan_free(&ctx->plan);
}

static void ops_free(dear_ctx_t *ctx)
{
    for (int b = 0; ctx->buckets && b < ctx->nbuckets; b++)
        if (ctx->buckets[b].fused)
            free(ctx->buckets[b].buf);
    for (int g = 0; ctx->groups && g < ctx->ngroups; g++) {
        free(ctx->groups[g].op.blocks);
        free(ctx->groups[g].op.deps);
    }
    free(ctx->buckets);
    free(ctx->groups);
    free(ctx->ops);
    ctx->buckets = NULL;
    ctx->groups = NULL;
    ctx->ops = NULL;
}

void dear_bucket_pack(const dear_ctx_t *ctx, const dear_bucket_t *b)
{
    size_t esz = dear_dtype_size(b->dtype);
    for (int t = b->t0; t < b->t1; t++) {
        const dear_tensor_t *tt = &ctx->tensors[t];
        memcpy((char *)b->buf + tt->off * esz, tt->grad, tt->bytes);
    }
}

void dear_bucket_unpack(const dear_ctx_t *ctx, const dear_bucket_t *b, int t0, int t1)
{
    size_t esz = dear_dtype_size(b->dtype);
    if (t0 < b->t0)
        t0 = b->t0;
    if (t1 > b->t1)
        t1 = b->t1;
    for (int t = t0; t < t1; t++) {
        const dear_tensor_t *tt = &ctx->tensors[t];
        memcpy(tt->grad, (const char *)b->buf + tt->off * esz, tt->bytes);
    }
}

/*
 * Partitions (DEAR_PARTITION): tensors larger than the setting are cut into units of at most
 * that many bytes (fusion/units.h), which the planners place in buckets and groups on their own.
 * Rank 0's setting holds, since rank 0 makes the plan every rank runs; planning asks
 * dear_partition_bytes. The row is on when it cuts a registered tensor.
 */
#include "base/mpi_check.h"
#include "base/params.h"
#include "runtime/rt.h"

size_t dear_partition_bytes(const dear_ctx_t *ctx) { return ctx->part.bytes; }

static int partition_decide(dear_ctx_t *ctx)
{
    long long bytes = dear_param_int(DEAR_P_PARTITION);
    DEAR_MPI_CHECK(MPI_Bcast(&bytes, 1, MPI_LONG_LONG, 0, ctx->cm.comm));
    ctx->part.bytes = (size_t)bytes;
    ctx->part.on = 0;
    for (int t = 0; t < ctx->reg.ntensors && bytes > 0; t++)
        ctx->part.on |= ctx->reg.tensors[t].bytes > ctx->part.bytes;
    return DEAR_OK;
}

static int partition_is_on(const dear_ctx_t *ctx) { return ctx->part.on; }

const dear_feature_t dear_feature_partition = {
    .decide = partition_decide,
    .on = partition_is_on,
};

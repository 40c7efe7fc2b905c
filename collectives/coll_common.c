/* The shard rule and names shared by every collective algorithm. */
#include "collectives/coll.h"

void dear_coll_shard(size_t count, int nranks, int rank, size_t *offset, size_t *len)
{
    size_t p = (size_t)nranks, r = (size_t)rank;
    size_t base = count / p, rem = count % p;
    *len = base + (r < rem ? 1 : 0);
    *offset = r * base + (r < rem ? r : rem);
}

const char *dear_coll_op_name(dear_coll_op_t op)
{
    static const char *const names[] = { "reduce_scatter", "allgather", "allreduce" };
    return (unsigned)op < DEAR_COLL_OP_COUNT ? names[op] : "unknown";
}

const char *dear_coll_algo_name(dear_coll_algo_t algo)
{
    static const char *const names[] = { "auto", "ring", "rhd", "mpi", "direct", "hier" };
    return (unsigned)algo < DEAR_ALGO_COUNT ? names[algo] : "unknown";
}

/* The shard rule shared by every collective algorithm. */
#include "collectives/coll.h"

void dear_coll_shard(size_t count, int nranks, int rank, size_t *offset, size_t *len)
{
    size_t p = (size_t)nranks, r = (size_t)rank;
    size_t base = count / p, rem = count % p;
    *len = base + (r < rem ? 1 : 0);
    *offset = r * base + (r < rem ? r : rem);
}

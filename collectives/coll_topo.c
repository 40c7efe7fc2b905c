/*
 * The hosts of a communicator, as the hierarchical algorithm needs them: which ranks share a
 * host (MPI_Comm_split_type SHARED, or host ids the caller gives), the communicators inside each
 * host and across the hosts (coll.h), and the table from (host, local index) to rank. Made
 * once per communicator, collectively, before any collective runs on it (MPI_Comm_split is a
 * collective call, which dear_coll_start must not make).
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "base/mpi_check.h"
#include "base/log.h"

void dear_coll_topo_free(dear_coll_topo_t *t, int keep_comms)
{
    if (t == NULL)
        return;
    for (int i = 0; i < 4; i++) {
        dear_net_close(t->opened[i]);
        free(t->mpi_net[i].waiting);
    }
    int fin = 0;
    MPI_Finalized(&fin);
    for (int i = 0; i < 2 && !fin && !keep_comms; i++) {
        if (t->node[i] != MPI_COMM_NULL)
            MPI_Comm_free(&t->node[i]);
        if (t->cross[i] != MPI_COMM_NULL)
            MPI_Comm_free(&t->cross[i]);
    }
    free(t->rank_of);
    free(t->host_of);
    free(t->local_of);
    free(t);
}

/* The endpoint slots in their fixed order: node and cross of the reduce-scatter stages, then of
 * the all-gather stages. */
static void topo_slots(dear_coll_topo_t *t, MPI_Comm comms[4], const dear_net_t **nets[4])
{
    for (int i = 0; i < 2; i++) {
        comms[2 * i] = t->node[i];
        comms[2 * i + 1] = t->cross[i];
        nets[2 * i] = &t->node_net[i];
        nets[2 * i + 1] = &t->cross_net[i];
    }
}

static void topo_mpi_nets(dear_coll_topo_t *t)
{
    MPI_Comm comms[4];
    const dear_net_t **nets[4];
    topo_slots(t, comms, nets);
    for (int i = 0; i < 4; i++) {
        dear_net_init_mpi(&t->mpi_net[i], comms[i]);
        /* Counted, so that a stall can name the ranks it waits for (freed with the topology). */
        t->mpi_net[i].waiting = calloc((size_t)t->mpi_net[i].size, sizeof(int));
        *nets[i] = &t->mpi_net[i];
    }
}

int dear_coll_topo_attach(dear_coll_topo_t *t, dear_transport_t *tp)
{
    if (t == NULL || tp == dear_transport_mpi())
        return DEAR_OK;
    MPI_Comm comms[4];
    const dear_net_t **nets[4];
    topo_slots(t, comms, nets);
    for (int i = 0; i < 4; i++)
        if (t->opened[i] == NULL)
            DEAR_CHECK(dear_net_open(tp, comms[i], &t->opened[i]));
    for (int i = 0; i < 4; i++)
        *nets[i] = t->opened[i];
    return DEAR_OK;
}

int dear_coll_topo_create(MPI_Comm comm, int host_id, dear_coll_topo_t **out)
{
    int rc = DEAR_OK, rank, size;
    int *all = NULL;
    dear_coll_topo_t *t = NULL;
    MPI_Comm node = MPI_COMM_NULL;
    DEAR_ARG_CHECK(out != NULL, "dear_coll_topo_create: out is NULL");
    *out = NULL;
    DEAR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    if (host_id < 0)
        DEAR_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    else
        DEAR_MPI_CHECK(MPI_Comm_split(comm, host_id, rank, &node));
    int local, nlocal;
    DEAR_MPI_CHECK_GOTO(MPI_Comm_rank(node, &local), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_size(node, &nlocal), rc, out);
    /* Hosts are numbered by their lowest rank's order: the leaders (local 0) count themselves. */
    int leader = local == 0, host = 0, nhosts = 0, mm[2] = { -nlocal, nlocal }, mmall[2];
    DEAR_MPI_CHECK_GOTO(MPI_Exscan(&leader, &host, 1, MPI_INT, MPI_SUM, comm), rc, out);
    if (rank == 0)
        host = 0; /* MPI_Exscan leaves rank 0's result undefined */
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&host, 1, MPI_INT, 0, node), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&leader, &nhosts, 1, MPI_INT, MPI_SUM, comm), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(mm, mmall, 2, MPI_INT, MPI_MAX, comm), rc, out);
    /* Two levels pay only with several hosts of several ranks each, all alike (the shard
     * layout assumes a full grid). Decided from allreduced values: every rank agrees. */
    if (nhosts < 2 || -mmall[0] != mmall[1] || mmall[1] < 2) {
        DEAR_DEBUG("coll", "topology: %d host(s), %d..%d rank(s) each: collectives stay flat", nhosts, -mmall[0],
                   mmall[1]);
        goto out;
    }
    DEAR_ALLOC_GOTO(t, calloc(1, sizeof *t), sizeof *t, rc, out);
    t->node[0] = node;
    node = MPI_COMM_NULL;
    t->node[1] = t->cross[0] = t->cross[1] = MPI_COMM_NULL;
    t->nhosts = nhosts;
    t->local_size = nlocal;
    t->host = host;
    t->local = local;
    DEAR_MPI_CHECK_GOTO(MPI_Comm_dup(t->node[0], &t->node[1]), rc, out);
    if (nhosts == 2)
        DEAR_MPI_CHECK_GOTO(MPI_Comm_dup(comm, &t->cross[0]), rc, out);
    else
        DEAR_MPI_CHECK_GOTO(MPI_Comm_split(comm, local, host, &t->cross[0]), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_dup(t->cross[0], &t->cross[1]), rc, out);
    topo_mpi_nets(t);
    size_t nb = sizeof(int) * 2 * (size_t)size;
    DEAR_ALLOC_GOTO(all, malloc(nb), nb, rc, out);
    int me[2] = { host, local };
    DEAR_MPI_CHECK_GOTO(MPI_Allgather(me, 2, MPI_INT, all, 2, MPI_INT, comm), rc, out);
    nb = sizeof(int) * (size_t)size;
    DEAR_ALLOC_GOTO(t->rank_of, malloc(nb), nb, rc, out);
    DEAR_ALLOC_GOTO(t->host_of, malloc(nb), nb, rc, out);
    DEAR_ALLOC_GOTO(t->local_of, malloc(nb), nb, rc, out);
    for (int r = 0; r < size; r++) {
        t->rank_of[all[2 * r] * nlocal + all[2 * r + 1]] = r;
        t->host_of[r] = all[2 * r];
        t->local_of[r] = all[2 * r + 1];
    }
    DEAR_INFO("coll", "topology: %d hosts x %d ranks; this rank is host %d, local %d: hierarchical collectives "
                      "available",
              nhosts, nlocal, host, local);
    *out = t;
    t = NULL;
out:
    if (node != MPI_COMM_NULL)
        MPI_Comm_free(&node);
    dear_coll_topo_free(t, 0);
    free(all);
    return rc;
}

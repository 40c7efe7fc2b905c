/*
 * The MPI transport: a message is MPI_Isend / MPI_Irecv of bytes on the endpoint's
 * communicator. MPI moves only when called, so it has no progress or block of its own: the
 * progress thread polls it through test.
 */
#include <limits.h>

#include "base/log.h"
#include "base/mpi_check.h"
#include "collectives/net.h"

static int fits(size_t bytes)
{
    if (bytes <= INT_MAX)
        return DEAR_OK;
    DEAR_ERROR("net", "a message of %zu bytes is beyond MPI's int count (%d)", bytes, INT_MAX);
    return DEAR_ERR_UNSUPPORTED;
}

static int mpi_isend(const dear_net_t *ep, const void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req)
{
    DEAR_CHECK(fits(bytes));
    dear_net_req_t q = { ep, { .mpi = MPI_REQUEST_NULL }, -1 };
    DEAR_MPI_CHECK(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, ep->comm, &q.u.mpi));
    *req = q;
    return DEAR_OK;
}

static int mpi_irecv(const dear_net_t *ep, void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req)
{
    DEAR_CHECK(fits(bytes));
    dear_net_req_t q = { ep, { .mpi = MPI_REQUEST_NULL }, -1 };
    DEAR_MPI_CHECK(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, ep->comm, &q.u.mpi));
    *req = q;
    return DEAR_OK;
}

static int mpi_test(dear_net_req_t *req, int *flag, size_t *bytes)
{
    MPI_Status status;
    DEAR_MPI_CHECK(MPI_Test(&req->u.mpi, flag, &status));
    if (*flag && bytes) {
        int n = 0;
        DEAR_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &n));
        *bytes = (size_t)n;
    }
    return DEAR_OK;
}

static void mpi_abandon(dear_net_req_t *req)
{
    if (req->u.mpi == MPI_REQUEST_NULL)
        return;
    /* Error path only, so failures here are deliberately ignored: cancelling a send may not
     * succeed, and freeing is what releases our side. */
    MPI_Cancel(&req->u.mpi);
    MPI_Request_free(&req->u.mpi);
}

static void mpi_cancel(dear_net_req_t *req)
{
    /* Error path: a failure leaves the receive to complete with its message. */
    if (req->u.mpi != MPI_REQUEST_NULL)
        MPI_Cancel(&req->u.mpi);
}

const dear_transport_ops_t dear_net_mpi_ops = {
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .abandon = mpi_abandon,
    .cancel = mpi_cancel,
};

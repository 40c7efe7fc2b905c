/*
 * The blocking collectives of the test programs (and of the library linked into them), waited for
 * without spinning: each is started as its nonblocking twin through the profiling interface and
 * polled with short sleeps in between.
 *
 * The tests run more ranks than cores. An MPI whose blocking calls poll without ever giving up
 * the core (MPICH's) then lets the spinning ranks starve the one that has work to do, and a sweep
 * of a few hundred checked collectives takes minutes. Every rank runs the same program, so every
 * rank makes the same nonblocking calls (which never match blocking ones). Linked only into the
 * tests that assert results, never timings (tests/local.mk TEST_MPI_LIBS): a sleeping wait wakes
 * late on a loaded machine, which the tests that time iterations would count.
 */
#include <mpi.h>
#include <time.h>

/* Poll a few times (a fast peer answers at once), then sleep 20 us between polls. */
static int polite_wait(MPI_Request *req)
{
    struct timespec nap = { 0, 20000 };
    for (int n = 0;; n++) {
        int done = 0, rc = PMPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done)
            return rc;
        if (n >= 16)
            nanosleep(&nap, NULL);
    }
}

int MPI_Allreduce(const void *send, void *recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm)
{
    MPI_Request req;
    int rc = PMPI_Iallreduce(send, recv, count, type, op, comm, &req);
    return rc != MPI_SUCCESS ? rc : polite_wait(&req);
}

int MPI_Bcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm)
{
    MPI_Request req;
    int rc = PMPI_Ibcast(buf, count, type, root, comm, &req);
    return rc != MPI_SUCCESS ? rc : polite_wait(&req);
}

int MPI_Barrier(MPI_Comm comm)
{
    MPI_Request req;
    int rc = PMPI_Ibarrier(comm, &req);
    return rc != MPI_SUCCESS ? rc : polite_wait(&req);
}

int MPI_Allgather(const void *send, int scount, MPI_Datatype stype, void *recv, int rcount, MPI_Datatype rtype,
                  MPI_Comm comm)
{
    MPI_Request req;
    int rc = PMPI_Iallgather(send, scount, stype, recv, rcount, rtype, comm, &req);
    return rc != MPI_SUCCESS ? rc : polite_wait(&req);
}

/*
 * The collectives' point-to-point layer (net.h): a small process-wide table of routes from an
 * attached communicator to its socket fabric, with its ranks in the fabric's numbering and a
 * context number of its own; everything else goes to MPI.
 */
#include "collectives/net.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "base/log.h"
#include "base/mpi_check.h"
#include "base/sync.h"

/* A runtime context attaches its communicator and hier's four; a few contexts at once. */
#define MAX_ROUTES 32

typedef struct {
    MPI_Comm comm;
    dear_sock_t *sock;
    uint32_t ctx;
    int size;
    int *to_base;               /* comm rank -> fabric rank */
} route_t;

static pthread_rwlock_t routes_lock = PTHREAD_RWLOCK_INITIALIZER;
static route_t routes[MAX_ROUTES];
static int nroutes;

/* Contexts are numbered per fabric in attach order; every member attaches alike (net.h). */
static uint32_t next_ctx(const dear_sock_t *s)
{
    uint32_t n = 0;
    for (int i = 0; i < nroutes; i++)
        if (routes[i].sock == s && routes[i].ctx >= n)
            n = routes[i].ctx + 1;
    return n;
}

int dear_net_attach(MPI_Comm comm, MPI_Comm base, dear_sock_t *s)
{
    int rc = DEAR_OK, size;
    MPI_Group g = MPI_GROUP_NULL, gb = MPI_GROUP_NULL;
    int *ranks = NULL, *to_base = NULL;
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    DEAR_ALLOC_GOTO(ranks, malloc((size_t)size * sizeof *ranks), (size_t)size * sizeof *ranks, rc, out);
    DEAR_ALLOC_GOTO(to_base, malloc((size_t)size * sizeof *to_base), (size_t)size * sizeof *to_base, rc, out);
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    DEAR_MPI_CHECK_GOTO(MPI_Comm_group(comm, &g), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_group(base, &gb), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Group_translate_ranks(g, size, ranks, gb, to_base), rc, out);
    for (int i = 0; i < size; i++)
        if (to_base[i] == MPI_UNDEFINED) {
            DEAR_ERROR("net", "dear_net_attach: rank %d of the communicator is not in the fabric's", i);
            rc = DEAR_ERR_INTERNAL;
            goto out;
        }
    DEAR_PTHREAD_MUST(pthread_rwlock_wrlock(&routes_lock));
    if (nroutes == MAX_ROUTES) {
        DEAR_ERROR("net", "dear_net_attach: more than %d communicators on socket fabrics at once", MAX_ROUTES);
        rc = DEAR_ERR_UNSUPPORTED;
    } else {
        routes[nroutes] = (route_t){ comm, s, next_ctx(s), size, to_base };
        nroutes++;
        to_base = NULL;
    }
    DEAR_PTHREAD_MUST(pthread_rwlock_unlock(&routes_lock));
out:
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (gb != MPI_GROUP_NULL)
        MPI_Group_free(&gb);
    free(ranks);
    free(to_base);
    return rc;
}

void dear_net_detach(MPI_Comm comm)
{
    DEAR_PTHREAD_MUST(pthread_rwlock_wrlock(&routes_lock));
    for (int i = 0; i < nroutes; i++)
        if (routes[i].comm == comm) {
            free(routes[i].to_base);
            routes[i] = routes[--nroutes];
            break;
        }
    DEAR_PTHREAD_MUST(pthread_rwlock_unlock(&routes_lock));
}

/* Under the read lock: comm's route, or NULL. */
static const route_t *route_of(MPI_Comm comm)
{
    for (int i = 0; i < nroutes; i++)
        if (routes[i].comm == comm)
            return &routes[i];
    return NULL;
}

dear_sock_t *dear_net_fabric(MPI_Comm comm)
{
    DEAR_PTHREAD_MUST(pthread_rwlock_rdlock(&routes_lock));
    const route_t *r = route_of(comm);
    dear_sock_t *s = r ? r->sock : NULL;
    DEAR_PTHREAD_MUST(pthread_rwlock_unlock(&routes_lock));
    return s;
}

static int post(int is_send, void *buf, size_t bytes, int peer, int tag, MPI_Comm comm, dear_net_req_t *req)
{
    DEAR_PTHREAD_MUST(pthread_rwlock_rdlock(&routes_lock));
    const route_t *r = route_of(comm);
    dear_sock_t *s = NULL;
    int to = 0, r_size = r ? r->size : 0;
    uint32_t ctx = 0;
    if (r && peer >= 0 && peer < r->size) {
        s = r->sock;
        to = r->to_base[peer];
        ctx = r->ctx;
    }
    int routed = r != NULL;
    DEAR_PTHREAD_MUST(pthread_rwlock_unlock(&routes_lock));
    if (routed && s == NULL) {
        DEAR_ERROR("net", "peer %d is outside the communicator of %d ranks", peer, r_size);
        return DEAR_ERR_INTERNAL;
    }
    dear_net_req_t q = DEAR_NET_REQ_NULL;
    if (s) {
        q.sock = s;
        DEAR_CHECK(is_send ? dear_sock_isend(s, to, ctx, tag, buf, bytes, &q.msg)
                           : dear_sock_irecv(s, to, ctx, tag, buf, bytes, &q.msg));
    } else {
        if (bytes > INT_MAX) {
            DEAR_ERROR("net", "a message of %zu bytes is beyond MPI's int count (%d)", bytes, INT_MAX);
            return DEAR_ERR_UNSUPPORTED;
        }
        if (is_send)
            DEAR_MPI_CHECK(MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, comm, &q.mpi));
        else
            DEAR_MPI_CHECK(MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, comm, &q.mpi));
    }
    *req = q;
    return DEAR_OK;
}

int dear_net_isend(const void *buf, size_t bytes, int peer, int tag, MPI_Comm comm, dear_net_req_t *req)
{
    return post(1, (void *)buf, bytes, peer, tag, comm, req);
}

int dear_net_irecv(void *buf, size_t bytes, int peer, int tag, MPI_Comm comm, dear_net_req_t *req)
{
    return post(0, buf, bytes, peer, tag, comm, req);
}

int dear_net_test_recv(dear_net_req_t *req, int *flag, size_t *bytes)
{
    if (req->sock) {
        DEAR_CHECK(dear_sock_test(req->sock, &req->msg, flag, bytes));
        if (*flag)
            *req = DEAR_NET_REQ_NULL;
        return DEAR_OK;
    }
    MPI_Status status;
    DEAR_MPI_CHECK(MPI_Test(&req->mpi, flag, &status));
    if (*flag && bytes) {
        int n = 0;
        DEAR_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &n));
        *bytes = (size_t)n;
    }
    return DEAR_OK;
}

int dear_net_test(dear_net_req_t *req, int *flag)
{
    return dear_net_test_recv(req, flag, NULL);
}

int dear_net_testall(int n, dear_net_req_t *reqs, int *flag)
{
    int all = 1;
    for (int i = 0; i < n; i++) {
        if (!dear_net_active(&reqs[i]))
            continue;
        int f = 0;
        DEAR_CHECK(dear_net_test(&reqs[i], &f));
        all &= f;
    }
    *flag = all;
    return DEAR_OK;
}

void dear_net_abandon(dear_net_req_t *req)
{
    if (req->sock) {
        dear_sock_abandon(req->sock, &req->msg);
        *req = DEAR_NET_REQ_NULL;
        return;
    }
    if (req->mpi == MPI_REQUEST_NULL)
        return;
    /* Error path only, so failures here are deliberately ignored: cancelling a send may not
     * succeed, and freeing is what releases our side. */
    MPI_Cancel(&req->mpi);
    MPI_Request_free(&req->mpi);
    req->mpi = MPI_REQUEST_NULL;
}

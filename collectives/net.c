/*
 * The transport layer's dispatch (net.h): a message goes to its endpoint's transport through the
 * ops table; the runtime's choice of transport (DEAR_TRANSPORT, with auto resolved) and the
 * endpoints' context numbers and rank translation live here, so that no layer above names a
 * transport.
 */
#include "collectives/net.h"

#include <stdlib.h>

#include "base/log.h"
#include "base/mpi_check.h"

/* Indexed by dear_transport_id_t (AUTO resolves first). */
#define TRANSPORT_OPS_DECL_(ID, NAME, OPS, FLAGS, HELP) extern const dear_transport_ops_t OPS;
DEAR_TRANSPORT_TABLE(TRANSPORT_OPS_DECL_)
#undef TRANSPORT_OPS_DECL_
#define TRANSPORT_OPS_(ID, NAME, OPS, FLAGS, HELP) [DEAR_TRANSPORT_##ID] = &OPS,
static const dear_transport_ops_t *const transport_table[DEAR_TRANSPORT_COUNT] = {
    [DEAR_TRANSPORT_AUTO] = NULL,
    DEAR_TRANSPORT_TABLE(TRANSPORT_OPS_)
};
#undef TRANSPORT_OPS_

static dear_transport_t mpi_instance = { &dear_net_mpi_ops, DEAR_TRANSPORT_MPI, MPI_COMM_NULL, NULL, 0 };

dear_transport_t *dear_transport_mpi(void)
{
    return &mpi_instance;
}

/* The row auto takes for a job that spans hosts: the first flagged for it. */
static dear_transport_id_t across_hosts_row(void)
{
    for (int t = DEAR_TRANSPORT_AUTO + 1; t < DEAR_TRANSPORT_COUNT; t++)
        if (dear_transport_id_flags((dear_transport_id_t)t) & DEAR_TRANSPORT_F_ACROSS_HOSTS)
            return (dear_transport_id_t)t;
    return DEAR_TRANSPORT_MPI;
}

int dear_transport_open(MPI_Comm comm, int id, int nhosts, dear_transport_t **out)
{
    int size = 1;
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    int chosen = id == DEAR_TRANSPORT_AUTO;
    if (id <= DEAR_TRANSPORT_AUTO || id >= DEAR_TRANSPORT_COUNT)
        id = nhosts > 1 ? across_hosts_row() : DEAR_TRANSPORT_MPI;
    const dear_transport_ops_t *ops = transport_table[id];
    if (id == DEAR_TRANSPORT_MPI || size == 1 || ops->create == NULL) {
        *out = dear_transport_mpi();
        return DEAR_OK;
    }
    dear_transport_t *tp = NULL;
    int rc = ops->create(comm, &tp);
    if (rc == DEAR_ERR_NET && chosen) {
        /* Every rank has the same rc (create agrees on it), so all go on over MPI together. */
        DEAR_WARN("net", "dear_init: the %s transport could not connect the ranks (above); DEAR_TRANSPORT=auto goes on "
                         "over MPI (DEAR_TRANSPORT=mpi skips the attempt)",
                  ops->name);
        *out = dear_transport_mpi();
        return DEAR_OK;
    }
    if (rc != DEAR_OK) {
        DEAR_ERROR("net", "dear_init: the %s transport (DEAR_TRANSPORT=%s) could not connect the ranks: %s; "
                          "DEAR_TRANSPORT=mpi runs without it",
                   ops->name, chosen ? "auto" : ops->name, dear_status_string(rc));
        return rc;
    }
    tp->ops = ops;
    tp->id = (dear_transport_id_t)id;
    tp->base = comm;
    if (ops->address)
        DEAR_INFO("net", "%s transport: %s, connected to %d peer(s)", ops->name, ops->address(tp), size - 1);
    *out = tp;
    return DEAR_OK;
}

void dear_transport_close(dear_transport_t *tp)
{
    if (tp == NULL || tp == &mpi_instance)
        return;
    tp->ops->destroy(tp);
}

void dear_net_init_mpi(dear_net_t *ep, MPI_Comm comm)
{
    *ep = (dear_net_t){ .tp = &mpi_instance, .comm = comm };
    MPI_Comm_rank(comm, &ep->rank);
    MPI_Comm_size(comm, &ep->size);
}

/* comm's ranks in tp's base communicator, for rows that address peers there. */
static int translate(const dear_transport_t *tp, dear_net_t *ep)
{
    int rc = DEAR_OK;
    MPI_Group g = MPI_GROUP_NULL, gb = MPI_GROUP_NULL;
    size_t nb = (size_t)ep->size * sizeof(int);
    int *ranks = NULL;
    DEAR_ALLOC_GOTO(ranks, malloc(nb), nb, rc, out);
    DEAR_ALLOC_GOTO(ep->to_base, malloc(nb), nb, rc, out);
    for (int i = 0; i < ep->size; i++)
        ranks[i] = i;
    DEAR_MPI_CHECK_GOTO(MPI_Comm_group(ep->comm, &g), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_group(tp->base, &gb), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Group_translate_ranks(g, ep->size, ranks, gb, ep->to_base), rc, out);
    for (int i = 0; i < ep->size; i++)
        if (ep->to_base[i] == MPI_UNDEFINED) {
            DEAR_ERROR("net", "dear_net_open: rank %d of the communicator is not in the %s transport's", i,
                       tp->ops->name);
            rc = DEAR_ERR_INTERNAL;
            goto out;
        }
out:
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (gb != MPI_GROUP_NULL)
        MPI_Group_free(&gb);
    free(ranks);
    return rc;
}

int dear_net_open(dear_transport_t *tp, MPI_Comm comm, dear_net_t **out)
{
    int rc = DEAR_OK;
    dear_net_t *ep = NULL;
    DEAR_ALLOC_GOTO(ep, calloc(1, sizeof *ep), sizeof *ep, rc, err);
    ep->tp = tp;
    ep->comm = comm;
    DEAR_MPI_CHECK_GOTO(MPI_Comm_rank(comm, &ep->rank), rc, err);
    DEAR_MPI_CHECK_GOTO(MPI_Comm_size(comm, &ep->size), rc, err);
    DEAR_ALLOC_GOTO(ep->waiting, calloc((size_t)ep->size, sizeof(int)), sizeof(int) * (size_t)ep->size, rc, err);
    if (tp->ops->open) {
        DEAR_CHECK_GOTO(translate(tp, ep), rc, err);
        ep->ctx = tp->next_ctx++; /* every member opens alike, so the numbers agree */
        DEAR_CHECK_GOTO(tp->ops->open(tp, ep), rc, err);
    }
    *out = ep;
    return DEAR_OK;
err:
    if (ep) {
        free(ep->to_base);
        free(ep->waiting);
    }
    free(ep);
    return rc;
}

void dear_net_close(dear_net_t *ep)
{
    if (ep == NULL)
        return;
    if (ep->tp->ops->close)
        ep->tp->ops->close(ep);
    free(ep->to_base);
    free(ep->waiting);
    free(ep);
}

static int peer_check(const dear_net_t *ep, int peer)
{
    if (peer >= 0 && peer < ep->size)
        return DEAR_OK;
    DEAR_ERROR("net", "peer %d is outside the communicator of %d ranks", peer, ep->size);
    return DEAR_ERR_INTERNAL;
}

int dear_net_isend(const dear_net_t *ep, const void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req)
{
    DEAR_CHECK(peer_check(ep, peer));
    DEAR_CHECK(ep->tp->ops->isend(ep, buf, bytes, peer, tag, req));
    req->peer = -1;
    return DEAR_OK;
}

int dear_net_irecv(const dear_net_t *ep, void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req)
{
    DEAR_CHECK(peer_check(ep, peer));
    DEAR_CHECK(ep->tp->ops->irecv(ep, buf, bytes, peer, tag, req));
    req->peer = peer;
    if (ep->waiting)
        ep->waiting[peer]++;
    return DEAR_OK;
}

/* A receive no longer outstanding (complete or abandoned). */
static void recv_over(dear_net_req_t *req)
{
    if (req->peer >= 0 && req->net->waiting)
        req->net->waiting[req->peer]--;
}

void dear_net_waiting(const dear_net_t *ep, MPI_Comm base, unsigned char *flags)
{
    if (ep == NULL || ep->waiting == NULL)
        return;
    MPI_Group g, gb;
    if (MPI_Comm_group(ep->comm, &g) != MPI_SUCCESS)
        return;
    if (MPI_Comm_group(base, &gb) == MPI_SUCCESS) {
        for (int p = 0; p < ep->size; p++) {
            int r = MPI_UNDEFINED;
            if (ep->waiting[p] > 0 && MPI_Group_translate_ranks(g, 1, &p, gb, &r) == MPI_SUCCESS &&
                r != MPI_UNDEFINED)
                flags[r] = 1;
        }
        MPI_Group_free(&gb);
    }
    MPI_Group_free(&g);
}

int dear_net_test_recv(dear_net_req_t *req, int *flag, size_t *bytes)
{
    if (req->net == NULL) {
        *flag = 1;
        return DEAR_OK;
    }
    DEAR_CHECK(req->net->tp->ops->test(req, flag, bytes));
    if (*flag) {
        recv_over(req);
        *req = DEAR_NET_REQ_NULL;
    }
    return DEAR_OK;
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
    if (req->net == NULL)
        return;
    recv_over(req);
    req->net->tp->ops->abandon(req);
    *req = DEAR_NET_REQ_NULL;
}

void dear_net_cancel(dear_net_req_t *req)
{
    if (req->net == NULL || !dear_net_is_recv(req))
        return;
    if (req->net->tp->ops->cancel)
        req->net->tp->ops->cancel(req);
    else
        dear_net_abandon(req);
}

int dear_transport_progress(dear_transport_t *tp)
{
    return tp && tp->ops->progress ? tp->ops->progress(tp) : DEAR_OK;
}

int dear_transport_block(dear_transport_t *tp, double timeout_s)
{
    return tp && tp->ops->block ? tp->ops->block(tp, timeout_s) : DEAR_OK;
}

void dear_transport_poke(dear_transport_t *tp)
{
    if (tp && tp->ops->poke)
        tp->ops->poke(tp);
}

void dear_transport_counters(dear_transport_t *tp, uint64_t *messages, uint64_t *timeouts)
{
    if (messages)
        *messages = 0;
    if (timeouts)
        *timeouts = 0;
    if (tp && tp->ops->counters)
        tp->ops->counters(tp, messages, timeouts);
}

void dear_transport_set_limits(dear_transport_t *tp, size_t max_message, size_t max_unexpected)
{
    if (tp && tp->ops->set_limits)
        tp->ops->set_limits(tp, max_message, max_unexpected);
}

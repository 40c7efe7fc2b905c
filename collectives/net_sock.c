/*
 * The socket transport as a row of the transport table: the fabric of sock.h, its endpoints
 * being contexts on it (a communicator and its sub-communicators each get their own) with
 * their peers translated to the fabric's ranks.
 */
#include <stdlib.h>

#include "base/check.h"
#include "base/params.h"
#include "collectives/net.h"
#include "collectives/sock.h"

static int sock_create(MPI_Comm comm, dear_transport_t **out)
{
    dear_sock_t *s = NULL;
    DEAR_CHECK(dear_sock_create(comm, dear_param_string(DEAR_P_SOCKET_IFNAME),
                                dear_param_double(DEAR_P_SOCKET_TIMEOUT_S), &s));
    dear_transport_t *tp = calloc(1, sizeof *tp);
    if (tp == NULL) {
        dear_sock_destroy(s);
        DEAR_ERROR("sys", "allocation of %zu bytes failed", sizeof *tp);
        return DEAR_ERR_NOMEM;
    }
    tp->impl = s; /* dear_transport_open fills in the rest */
    *out = tp;
    return DEAR_OK;
}

static void sock_destroy(dear_transport_t *tp)
{
    dear_sock_destroy(tp->impl);
    free(tp);
}

static int sock_post(int send, const dear_net_t *ep, void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req)
{
    dear_sock_t *s = ep->tp->impl;
    dear_sock_msg_t *m = NULL;
    int to = ep->to_base[peer];
    DEAR_CHECK(send ? dear_sock_isend(s, to, ep->ctx, tag, buf, bytes, &m) : dear_sock_irecv(s, to, ep->ctx, tag, buf, bytes, &m));
    *req = (dear_net_req_t){ ep, { .msg = m }, -1 };
    return DEAR_OK;
}

static int sock_isend(const dear_net_t *ep, const void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req)
{
    return sock_post(1, ep, (void *)buf, bytes, peer, tag, req);
}

static int sock_irecv(const dear_net_t *ep, void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req)
{
    return sock_post(0, ep, buf, bytes, peer, tag, req);
}

static int sock_test(dear_net_req_t *req, int *flag, size_t *bytes)
{
    dear_sock_msg_t *m = req->u.msg;
    int rc = dear_sock_test(req->net->tp->impl, &m, flag, bytes);
    req->u.msg = m;
    return rc;
}

static void sock_abandon(dear_net_req_t *req)
{
    dear_sock_msg_t *m = req->u.msg;
    dear_sock_abandon(req->net->tp->impl, &m);
}

static int sock_progress(dear_transport_t *tp) { return dear_sock_progress(tp->impl); }
static int sock_block(dear_transport_t *tp, double timeout_s) { return dear_sock_block(tp->impl, timeout_s); }
static void sock_poke(dear_transport_t *tp) { dear_sock_poke(tp->impl); }
static const char *sock_address(const dear_transport_t *tp) { return dear_sock_address(tp->impl); }

static void sock_set_limits(dear_transport_t *tp, size_t max_message, size_t max_unexpected)
{
    dear_sock_set_limits(tp->impl, max_message, max_unexpected);
}

static void sock_counters(dear_transport_t *tp, uint64_t *messages, uint64_t *timeouts)
{
    dear_sock_counters(tp->impl, messages, timeouts);
}

/* Endpoints need only their context number and translation (net.c); opening is a no-op that
 * marks the row as one that addresses peers in its base communicator. */
static int sock_open(dear_transport_t *tp, dear_net_t *ep) { return DEAR_OK; }

const dear_transport_ops_t dear_net_sock_ops = {
    .name = "socket",
    .create = sock_create,
    .open = sock_open,
    .isend = sock_isend,
    .irecv = sock_irecv,
    .test = sock_test,
    .abandon = sock_abandon,
    .progress = sock_progress,
    .block = sock_block,
    .poke = sock_poke,
    .counters = sock_counters,
    .set_limits = sock_set_limits,
    .address = sock_address,
    .destroy = sock_destroy,
};

/*
 * Point-to-point messages of the collectives, over MPI or over the socket transport (sock.h).
 * A communicator the runtime attached to a socket fabric sends its messages there; any other
 * goes through MPI_Isend / MPI_Irecv as before. The algorithms are written once, against this.
 */
#ifndef DEAR_NET_H
#define DEAR_NET_H

#include <mpi.h>
#include <stddef.h>

#include "collectives/sock.h"

typedef struct {
    MPI_Request mpi;
    dear_sock_t *sock;          /* non-NULL: the message is msg on this fabric */
    dear_sock_msg_t *msg;
} dear_net_req_t;

#define DEAR_NET_REQ_NULL ((dear_net_req_t){ MPI_REQUEST_NULL, NULL, NULL })

/* Route comm's messages through fabric s, which was created on base: comm's ranks are
 * translated to base's. Every rank of comm must attach it (and its other attached
 * communicators) in the same order: that order numbers the contexts that keep their messages
 * apart. Not collective; no message of comm may be in flight. */
int dear_net_attach(MPI_Comm comm, MPI_Comm base, dear_sock_t *s);

/* Forget comm's route (before freeing comm or the fabric). Unknown comms are ignored. */
void dear_net_detach(MPI_Comm comm);

/* The fabric comm is attached to, or NULL (MPI). */
dear_sock_t *dear_net_fabric(MPI_Comm comm);

/* Post a message of bytes to or from peer (a rank of comm) with tag. *req set on success. */
int dear_net_isend(const void *buf, size_t bytes, int peer, int tag, MPI_Comm comm, dear_net_req_t *req);
int dear_net_irecv(void *buf, size_t bytes, int peer, int tag, MPI_Comm comm, dear_net_req_t *req);

/* *flag = 1 once complete (req becomes DEAR_NET_REQ_NULL; a null request is complete). Errors
 * are logged and returned (DEAR_ERR_MPI, DEAR_ERR_NET). test_recv also gives the bytes a
 * completed receive got (at most its size). */
int dear_net_test(dear_net_req_t *req, int *flag);
int dear_net_test_recv(dear_net_req_t *req, int *flag, size_t *bytes);

/* *flag = 1 once all n are complete (the complete ones become null). */
int dear_net_testall(int n, dear_net_req_t *reqs, int *flag);

/* 1 while req stands for a message not yet complete. */
static inline int dear_net_active(const dear_net_req_t *req)
{
    return req->sock ? req->msg != NULL : req->mpi != MPI_REQUEST_NULL;
}

/* Cancel (where possible) and free a request still outstanding; error paths only. */
void dear_net_abandon(dear_net_req_t *req);

#endif

/*
 * What carries the collectives' messages: a transport is a row of DEAR_TRANSPORT_TABLE
 * (base/transport_table.h), one ops table as NCCL's ncclTransport and UCX's uct_iface_ops are,
 * and the layers above hold a pointer to it without naming an implementation. MPI point to
 * point (net_mpi.c) and the socket fabric (net_sock.c) are its rows.
 *
 * Two objects:
 *   dear_transport_t  one instance of a row (the MPI library; a socket fabric with its
 *                     connections): what the progress thread moves, sleeps on and pokes.
 *   dear_net_t        a communicator on a transport (an endpoint): what a collective is given
 *                     and posts its messages to, peers being ranks of that communicator.
 * Several endpoints share one transport (a communicator and hier's sub-communicators), each
 * with a context number of its own that keeps their messages apart.
 */
#ifndef DEAR_NET_H
#define DEAR_NET_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "base/transport_table.h"

typedef struct dear_transport dear_transport_t;
typedef struct dear_net dear_net_t;
struct dear_coll_args;

/* A message in flight: inactive when net is NULL (completed, or never posted). */
typedef struct {
    const dear_net_t *net;
    union {
        MPI_Request mpi;
        void *msg;
    } u;
    int peer;                   /* a receive's peer (for the count of receives outstanding), or -1 */
} dear_net_req_t;

#define DEAR_NET_REQ_NULL ((dear_net_req_t){ NULL, { .msg = NULL }, -1 })

/* A visitor of requests (dear_coll_each_req). */
typedef void (*dear_net_req_fn_t)(dear_net_req_t *req, void *arg);

/* A transport's operations. Those marked optional may be NULL. */
typedef struct dear_transport_ops {
    const char *name;
    /* Collective over comm: the instance for comm's ranks (e.g. connections between every
     * pair). Every rank returns the same status; *out set only on success. */
    int (*create)(MPI_Comm comm, dear_transport_t **out);
    /* An endpoint for comm (every rank of which belongs to the communicator the instance was
     * created on) in ep, allocated by the caller; not collective, but every member opens the
     * transport's endpoints in the same order. Optional: without it the endpoint needs nothing. */
    int (*open)(dear_transport_t *tp, dear_net_t *ep);
    void (*close)(dear_net_t *ep);
    /* Post a message of bytes to or from peer (a rank of ep's communicator) with tag; req set
     * on success. A send's buffer stays untouched until it completes, a receive's until it
     * completes or is abandoned. */
    int (*isend)(const dear_net_t *ep, const void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req);
    int (*irecv)(const dear_net_t *ep, void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req);
    /* *flag = 1 once complete, *bytes (when not NULL) the length a receive got. */
    int (*test)(dear_net_req_t *req, int *flag, size_t *bytes);
    /* Error paths only: cancel where possible and free. */
    void (*abandon)(dear_net_req_t *req);
    /* Optional, error paths: a receive stops matching new messages but stays active; test then
     * completes it, cancelled or, when a message had already matched, once its data is in (the
     * sender must progress). For rows that let the library write a receive's buffer after it was
     * freed (MPI: a matched receive survives MPI_Cancel and MPI_Request_free); a row without it
     * makes abandon safe at once. */
    void (*cancel)(dear_net_req_t *req);
    /* Optional: move what can move now without waiting (a transport that moves only inside
     * test, as MPI, has none). */
    int (*progress)(dear_transport_t *tp);
    /* Optional: sleep until something can move, poke is called, or timeout_s passes; a
     * transport without it can only be polled. */
    int (*block)(dear_transport_t *tp, double timeout_s);
    /* Optional (with block): wake a block now or the next one to start; thread-safe. */
    void (*poke)(dear_transport_t *tp);
    /* Optional: messages completed both ways, and blocks that slept the whole timeout. */
    void (*counters)(dear_transport_t *tp, uint64_t *messages, uint64_t *timeouts);
    /* Optional: the most a peer may make this rank hold: its largest message, and the bytes
     * of messages that arrived before their receives, per peer (a transport that buffers what
     * a peer sends ahead checks what a peer claims against these). */
    void (*set_limits)(dear_transport_t *tp, size_t max_message, size_t max_unexpected);
    /* Optional: "a.b.c.d:port" or similar for logs. */
    const char *(*address)(const dear_transport_t *tp);
    void (*destroy)(dear_transport_t *tp);
    /* Optional: whole collectives the transport runs itself on memory of its own kind (NCCL on
     * device memory), ordered on its queue: start enqueues args' collective (dear_coll_args_t,
     * collectives/coll.h) and returns at once, its result in place for whatever is enqueued on
     * that queue after it; test says when it has completed; release frees the handle. Such a
     * transport carries no point-to-point messages (isend and irecv may be NULL). */
    int (*coll_start)(const dear_net_t *ep, const struct dear_coll_args *args, void **handle);
    int (*coll_test)(void *handle, int *done);
    void (*coll_release)(void *handle);
} dear_transport_ops_t;

struct dear_transport {
    const dear_transport_ops_t *ops;
    dear_transport_id_t id;
    MPI_Comm base;              /* the communicator it was created on */
    void *impl;                 /* the row's own state */
    uint32_t next_ctx;          /* context numbers handed to endpoints so far */
};

struct dear_net {
    dear_transport_t *tp;
    MPI_Comm comm;
    int rank, size;
    uint32_t ctx;               /* keeps this endpoint's messages apart from its siblings' */
    int *to_base;               /* comm rank -> rank of tp->base (rows with open) */
    int *waiting;               /* per peer, receives posted and not complete (NULL: not counted);
                                 * the one thread that drives the endpoint's messages keeps it */
};

/* The MPI library as a transport: one process-wide instance, nothing to create or destroy. */
dear_transport_t *dear_transport_mpi(void);

/* Collective over comm: the transport DEAR_TRANSPORT names, with auto resolved: a row flagged
 * DEAR_TRANSPORT_F_ACROSS_HOSTS when the job spans hosts (nhosts > 1), MPI otherwise; auto's
 * choice falls back on MPI with a warning when that row cannot connect the ranks
 * (DEAR_ERR_NET), since it must not break a job MPI can run, never when a peer failed to
 * authenticate (DEAR_ERR_AUTH). id is rank 0's (the caller broadcasts it). *out set on success. */
int dear_transport_open(MPI_Comm comm, int id, int nhosts, dear_transport_t **out);

/* Destroys an instance (its endpoints closed first); the MPI instance and NULL are ignored. */
void dear_transport_close(dear_transport_t *tp);

/* The row's name: "mpi", "socket", ... */
static inline const char *dear_transport_name(const dear_transport_t *tp) { return tp->ops->name; }

/* An endpoint for comm on tp (rank numbers translated to tp's base communicator); *out
 * allocated, close it with dear_net_close. Every member of comm opens its endpoints in the same
 * order. */
int dear_net_open(dear_transport_t *tp, MPI_Comm comm, dear_net_t **out);
void dear_net_close(dear_net_t *ep);
/* An endpoint for comm on MPI in caller-owned storage: nothing to close, no count of receives. */
void dear_net_init_mpi(dear_net_t *ep, MPI_Comm comm);

/* A stalled collective's peers: sets flags[r] (r a rank of base, which holds ep's ranks) for every
 * rank ep has receives outstanding from. Endpoints that do not count add nothing. */
void dear_net_waiting(const dear_net_t *ep, MPI_Comm base, unsigned char *flags);

int dear_net_isend(const dear_net_t *ep, const void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req);
int dear_net_irecv(const dear_net_t *ep, void *buf, size_t bytes, int peer, int tag, dear_net_req_t *req);

/* *flag = 1 once complete (req becomes DEAR_NET_REQ_NULL; an inactive request is complete).
 * Errors are logged and returned (DEAR_ERR_MPI, DEAR_ERR_NET). test_recv also gives the bytes a
 * completed receive got (at most its size). */
int dear_net_test_recv(dear_net_req_t *req, int *flag, size_t *bytes);
static inline int dear_net_test(dear_net_req_t *req, int *flag) { return dear_net_test_recv(req, flag, NULL); }

/* *flag = 1 once all n are complete (the complete ones become inactive). */
int dear_net_testall(int n, dear_net_req_t *reqs, int *flag);

/* 1 while req stands for a message not yet complete. */
static inline int dear_net_active(const dear_net_req_t *req) { return req->net != NULL; }

/* Cancel (where possible) and free a request still outstanding; error paths only. The buffer of
 * an MPI send or receive that had matched may still be read or written afterwards: the runtime
 * settles (dear_net_cancel, then test) before it frees what its messages point at. */
void dear_net_abandon(dear_net_req_t *req);

/* Error paths: a receive stops matching (the transport's cancel; abandoned at once where the
 * transport has none) and completes through test; a send is left to complete, since its
 * receiver may already be taking it. Inactive requests are ignored. */
void dear_net_cancel(dear_net_req_t *req);

/* 1 for a receive (not yet complete), 0 for a send. */
static inline int dear_net_is_recv(const dear_net_req_t *req) { return req->peer >= 0; }

/* The transport's optional operations, harmless where it has none: progress and poke do
 * nothing, block returns at once with DEAR_OK, counters read 0; can_block says whether block
 * really sleeps until something moves. */
int dear_transport_progress(dear_transport_t *tp);
int dear_transport_block(dear_transport_t *tp, double timeout_s);
void dear_transport_poke(dear_transport_t *tp);
void dear_transport_counters(dear_transport_t *tp, uint64_t *messages, uint64_t *timeouts);
static inline int dear_transport_can_block(const dear_transport_t *tp) { return tp != NULL && tp->ops->block != NULL; }
void dear_transport_set_limits(dear_transport_t *tp, size_t max_message, size_t max_unexpected);

#endif

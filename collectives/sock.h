/*
 * The socket transport: one TCP connection between every pair of ranks of a communicator, set
 * up once (addresses exchanged over MPI), then driven without MPI. Its point of being is the
 * wait: with transfers in flight and none ready, the progress thread sleeps in epoll until the
 * kernel has bytes for it or room for its sends (as gloo and NCCL's socket transport do), where
 * MPI over TCP can only be polled. On cores shared with the training's compute, every poll
 * takes a slice from it (docs/DESIGN.md, "The socket transport").
 *
 * Messages are (context, tag, bytes) on a pair's connection, in posting order. A receive
 * matches the earliest message of its context and tag from its peer, as MPI's do; a message
 * that arrives before its receive is read into a buffer of its own (never left in the socket,
 * so no sender can block another message behind it), and a receive posted while such a message
 * is still arriving takes over the rest of it in place. A send is complete once the kernel holds
 * all of it (or, to a rank of this host, once the ring does). Several communicators (a communicator and its sub-communicators) share one
 * fabric, each with its own context number. Ranks of one host move payloads through shared
 * memory (sock_shm.h, DEAR_SOCKET_SHM_BYTES), with the same semantics. What a peer's headers
 * may make a rank hold is bounded (dear_sock_set_limits), and who may be a peer is proved at
 * set-up (docs/DESIGN.md, "Trust model").
 *
 * Thread-safe: one lock per fabric. Only dear_sock_block sleeps, and it releases the lock.
 */
#ifndef DEAR_SOCK_H
#define DEAR_SOCK_H

#include <mpi.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dear_sock dear_sock_t;
typedef struct dear_sock_msg dear_sock_msg_t;

/* Collective over comm: every rank listens on an address of an interface that ifnames selects
 * (a comma-separated list of name prefixes, '^' in front to exclude them instead; empty: every
 * interface but loopback and docker's, loopback when there is no other), the addresses and a
 * fresh random key are exchanged over comm, and every pair connects within timeout_s seconds,
 * each side proving to the other that it holds the key and the acceptor checking that the
 * connection comes from the address comm gave for the rank it claims. Connections that do not
 * (strangers, replays, silent ones) are turned away without delaying the ranks'. Every rank
 * returns the same status: one that fails makes all fail (DEAR_ERR_NET, or DEAR_ERR_PARAM for an
 * ifnames that selects nothing), each logging what it saw; a rank that connected twice with the
 * key is named on every rank, which return DEAR_ERR_AUTH. Connections get TCP keepalive and a TCP_USER_TIMEOUT of
 * DEAR_SOCKET_DEAD_S, so a peer whose host or link died fails its messages in that time.
 * *out set only on success. */
int dear_sock_create(MPI_Comm comm, const char *ifnames, double timeout_s, dear_sock_t **out);

/* What a peer may make this rank hold: a header announcing more than max_message bytes, or a
 * message without its receive yet that would take the bytes queued that way from one peer
 * (payloads plus DEAR_SOCK_MSG_COST each) past max_unexpected, fails that peer's connection
 * (DEAR_ERR_NET for its messages, the log naming the peer and the sizes) before anything is
 * allocated for it. Whoever knows what the ranks can send sets these, before any peer may send
 * more than the defaults; 0 keeps a limit as it is. */
#define DEAR_SOCK_MAX_MESSAGE_DEFAULT ((size_t)256 << 20)
#define DEAR_SOCK_MAX_UNEXPECTED_DEFAULT ((size_t)256 << 20)
#define DEAR_SOCK_MSG_COST 128
void dear_sock_set_limits(dear_sock_t *s, size_t max_message, size_t max_unexpected);

/* Closes every connection; messages still queued or in flight are dropped. NULL is accepted. */
void dear_sock_destroy(dear_sock_t *s);

/* This rank's address as "a.b.c.d:port", for logs. */
const char *dear_sock_address(const dear_sock_t *s);

/* Post a send or a receive of bytes to or from peer (a rank of the communicator the fabric was
 * created on) in context ctx with tag. A send's buffer must stay untouched until it completes, a
 * receive's until it completes or is abandoned. A message longer than its receive fails that
 * receive (DEAR_ERR_NET, naming both sizes); a shorter one completes it. *msg set on success. */
int dear_sock_isend(dear_sock_t *s, int peer, uint32_t ctx, int tag, const void *buf, size_t bytes,
                    dear_sock_msg_t **msg);
int dear_sock_irecv(dear_sock_t *s, int peer, uint32_t ctx, int tag, void *buf, size_t bytes, dear_sock_msg_t **msg);

/* *flag = 1 and *msg freed (set to NULL) once complete, with *bytes (when not NULL) the payload's
 * length; DEAR_ERR_NET (and *msg freed) when it failed (its connection broke, or a message was
 * longer than its receive: the log says which). Does not move data: see progress. */
int dear_sock_test(dear_sock_t *s, dear_sock_msg_t **msg, int *flag, size_t *bytes);

/* Drop a message on an error path: a receive is withdrawn (the rest of a message already
 * arriving for it is read and discarded), a send still going out is copied so the connection
 * stays whole. *msg becomes NULL. */
void dear_sock_abandon(dear_sock_t *s, dear_sock_msg_t **msg);

/* Move whatever the sockets allow now, without waiting. DEAR_OK even when a connection broke:
 * the messages it carried fail, and their tests say so. */
int dear_sock_progress(dear_sock_t *s);

/* Sleep until a socket with work to do is ready, dear_sock_poke is called, or timeout_s passes;
 * then move what is ready. */
int dear_sock_block(dear_sock_t *s, double timeout_s);

/* Wake a dear_sock_block now or the next one to start (async-signal-unsafe, thread-safe). */
void dear_sock_poke(dear_sock_t *s);

/* Counters since creation: messages completed both ways, and dear_sock_block calls that slept
 * the whole timeout. Either pointer may be NULL. */
void dear_sock_counters(dear_sock_t *s, uint64_t *messages, uint64_t *timeouts);

/* ---- for tests: what a stranger on the network could see or try ------------------------ */

/* What dear_sock_create knows once the addresses and the key are exchanged. */
typedef struct {
    int rank, size;
    const unsigned char *key;         /* DEAR_SOCK_KEY_BYTES (sock_auth.h) */
    const struct sockaddr_in *addrs;  /* every rank's listening address */
} dear_sock_setup_view_t;

typedef struct {
    /* Called on every rank after the exchange, before it connects: a test plays a rogue here. */
    void (*before_connect)(void *arg, const dear_sock_setup_view_t *v);
    /* Called before each set-up record this rank sends to rank `to` (a hello or a proof): the
     * bytes a sniffer on the path would capture. */
    void (*tap)(void *arg, int to, const void *rec, size_t len);
    void *arg;
} dear_sock_hooks_t;

/* Hooks for the dear_sock_create calls that follow; NULL removes them. Not thread-safe. */
void dear_sock_set_hooks(const dear_sock_hooks_t *hooks);

/* How many peers this rank reaches through shared-memory rings (sock_shm.h), and the ring to
 * (out = 1) or from one of them (NULL: that pair has none), for a test that plays a lying peer. */
struct dear_ring;
int dear_sock_ring_peers(const dear_sock_t *s);
struct dear_ring *dear_sock_ring(const dear_sock_t *s, int peer, int out);

#endif

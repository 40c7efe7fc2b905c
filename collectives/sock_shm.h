/*
 * The socket transport's shared-memory rings (sock.c): between two ranks of one host, payloads
 * travel through a ring in a shared segment instead of the loopback TCP connection, sparing the
 * kernel's TCP work and system calls on the cores the ranks share (the bytes are copied twice
 * either way: into the ring and out of it). The connection stays:
 * headers (and "look at the rings" doorbells) still travel on it, so the progress thread still
 * sleeps in epoll. A ring is one direction, one writer and one reader, with counters of bytes
 * ever written (head, the writer's) and read (tail, the reader's) and a waiting flag for each
 * side: a side that found the ring empty (or full) raises its flag and looks again; the other
 * side, having moved its counter, takes the flag down and rings the doorbell.
 *
 * Every rank creates one segment for the rings into it (one per other rank of its host), under
 * a name of 128 random bits, exclusive and mode 0600; the names travel over MPI, every peer maps
 * it, and the creator unlinks it once all have, so nothing is left in /dev/shm after set-up.
 * A counter the peer writes is a peer's claim: one that says more than a ring holds fails.
 */
#ifndef DEAR_SOCK_SHM_H
#define DEAR_SOCK_SHM_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dear_ring dear_ring_t;
typedef struct dear_shm dear_shm_t;

/* The rings DEAR_SOCKET_SHM_BYTES may ask for (0 turns them off). */
#define DEAR_SHM_RING_MIN 4096
#define DEAR_SHM_RING_MAX ((size_t)1 << 30)
/* What one rank's rings (from every other rank of its host) may take at most: with many ranks
 * on a host each ring is smaller than asked, down to DEAR_SHM_RING_MIN. */
#define DEAR_SHM_RANK_BYTES ((size_t)64 << 20)

/* DEAR_ERR_PARAM, logged with what is accepted, for ring_bytes outside them. Local: a caller
 * checks every rank's before the collective create, which would leave the others waiting if
 * it refused on one rank alone. */
int dear_shm_check(size_t ring_bytes);

/* Collective over comm: rings of ring_bytes (one dear_shm_check accepted) each way between
 * every pair of ranks of comm that share a host (MPI_COMM_TYPE_SHARED). Where a rank of a host
 * asks for none (0) or cannot create or map a segment, that host's pairs keep TCP alone, which
 * the log says; *out is then NULL on the ranks of that host, as it is for a rank alone on its
 * host. DEAR_ERR_MPI when MPI fails. */
int dear_shm_create(MPI_Comm comm, size_t ring_bytes, dear_shm_t **out);
void dear_shm_destroy(dear_shm_t *shm);

/* The ring from peer (a rank of comm) to this rank and the one back, or NULL (no ring: TCP). */
dear_ring_t *dear_shm_ring_in(const dear_shm_t *shm, int peer);
dear_ring_t *dear_shm_ring_out(const dear_shm_t *shm, int peer);

/* Writer: copy up to n bytes of src in, as many as there is room for; the count, or -1 when the
 * reader's counter claims what cannot be (more read than written). */
long long dear_ring_put(dear_ring_t *r, const void *src, size_t n);
/* Reader: copy up to n bytes out into dst (NULL: skip them); the count, or -1 when the writer's
 * counter claims more than the ring holds. */
long long dear_ring_get(dear_ring_t *r, void *dst, size_t n);

/* Reader found nothing: raise its flag and look again. 1: still empty, the writer will ring;
 * 0: bytes came meanwhile (the flag is down again). Writer, ring full: the same for room. */
int dear_ring_wait_data(dear_ring_t *r);
int dear_ring_wait_room(dear_ring_t *r);
/* After moving its counter: 1 when the other side was waiting (its flag is now down), so the
 * caller rings the doorbell. */
int dear_ring_reader_waits(dear_ring_t *r);
int dear_ring_writer_waits(dear_ring_t *r);

size_t dear_ring_bytes(const dear_ring_t *r);

/* For tests: store value in the shared block as this side's counter, as a lying peer would,
 * leaving this side's own copy as it was. */
void dear_ring_claim(dear_ring_t *r, uint64_t value, int writer);

#endif

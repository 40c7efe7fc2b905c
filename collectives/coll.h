/*
 * Non-blocking collectives as resumable state machines.
 *
 * A collective is started with dear_coll_start and then advanced with dear_coll_progress until
 * it reports done; each progress call does a bounded amount of work and never blocks, so one
 * progress thread can drive many collectives at once on one communicator. Collectives in
 * flight at the same time on one communicator must be started in the same order on every rank
 * and carry distinct tags; they may complete in any order.
 *
 * The shard rule (one function for every phase and algorithm): a vector of `count` elements
 * over P ranks is cut into P contiguous shards; rank r owns
 *     len_r = count / P + (r < count % P ? 1 : 0),   offset_r = r * (count / P) + min(r, count % P).
 * So counts need not divide P, ranks beyond `count` own empty shards, and shards are in rank
 * order. Reduce-scatter leaves rank r with the reduced shard r; all-gather assembles all shards.
 *
 * Buffer conventions (count = elements of the full vector; off/len = this rank's shard):
 *   REDUCE_SCATTER  out of place: sendbuf has count elements, recvbuf receives len elements.
 *                   in place (sendbuf NULL or == recvbuf): recvbuf has count elements, the result
 *                   lands at recvbuf[off, off+len); other elements are left unspecified.
 *   ALLGATHER       out of place: sendbuf has len elements, recvbuf receives count elements.
 *                   in place: recvbuf has count elements with this rank's shard at [off, off+len).
 *   ALLREDUCE       sendbuf and recvbuf have count elements; in place when sendbuf is NULL or
 *                   == recvbuf.
 *   Multi-block REDUCE_SCATTER and ALLGATHER (nblocks > 0, in place only): each block is its
 *                   own sharded vector of block.count elements of which only [lo, hi) travels;
 *                   this rank's shard is, block after block, its shard of each block intersected
 *                   with [lo, hi): an all-gather contributes it, a reduce-scatter leaves it reduced
 *                   in place (the block's other elements are left unspecified). One collective
 *                   serves every block (one start-up cost for several buckets, or part of one
 *                   bucket). A range that is a block of its own (buf at its start, lo 0, hi count)
 *                   is spread over every rank; a range inside a larger block lies in the shards
 *                   it falls in, so its all-gather runs at the speed of the ranks holding it.
 * Block-sparse (algo sparse, sparse_block > 0 elements per block): the vector is cut into blocks
 *                   of sparse_block elements from element 0 (the last one may be ragged); a block
 *                   cut by a shard boundary is two pieces, one per shard. Only the pieces that are
 *                   not all-bits-zero travel, each message dense instead when that is no larger
 *                   (coll_sparse.c). The shards, buffers and results are those of the dense
 *                   collectives above: an all-gather's receiver needs no zeroed buffer, the pieces
 *                   that do not travel are written as zeros. A multi-block collective cuts each
 *                   of its blocks from the block's lo, so a row stays one piece per shard.
 * Reductions are sums; 16-bit float types are added in float32 and rounded once, when the
 * result is final, whatever the algorithm and the rank count (partial sums travel and wait in
 * float32), so every rank gets round16(float32 sum * scale); integer-valued data stay exact.
 * `scale` multiplies every reduced element (1/P averages) and must be 1 for int32. Out-of-place
 * buffers must not overlap.
 * Compression (args.compress, float32 vectors on two or more ranks): the messages carry 16-bit
 *                   values, half the bytes. A reduce-scatter's partial sums are taken in float32
 *                   and rounded to the 16-bit type only to travel; a rank adds its own float32
 *                   input unrounded where the algorithm allows (ring, direct, sparse; the others
 *                   add it rounded), and its result is float32 (sum * scale, never rounded after
 *                   the last addition). An all-gather rounds each shard once and every rank, its
 *                   owner included, receives the rounded values widened back to float32, so all
 *                   ranks hold the same bits. Buffers, shards and results are float32 as above.
 *                   An all-reduce runs compress's reduce-scatter and compress_ag's all-gather; an
 *                   algorithm with an all-reduce of its own (rhd, mpi, hier) runs it all in
 *                   compress's format, rounding its partial sums in 16 bits, and returns the sum
 *                   rounded once more. Under DEAR_DETERMINISTIC every contribution is rounded once,
 *                   so the sum does not depend on which rank owns an element.
 *                   int8 (DEAR_COMPRESS_INT8, a quarter of the bytes plus a float32 scale per 256
 *                   values) quantizes each value once per phase, which the direct exchange does,
 *                   hier across its hosts and sparse (values only), so a collective with an int8
 *                   phase runs hier where hier was asked for or auto picks it, sparse where asked
 *                   for with a sparse_block, else algo direct, whatever was asked
 *                   (its all-reduce composed of the two phases): a reduce-scatter quantizes rank
 *                   p's chunk for p (under hier, inside a host float32 and the host's partial
 *                   sum of p's chunk quantized for p), which adds the values to its own float32
 *                   chunk in float32 (rounded result: none); an all-gather quantizes each shard
 *                   once at its owner and every rank takes the values of those bytes.
 *                   With ef, each quantization quantizes value + ef and leaves in ef what it
 *                   dropped: the reduce-scatter at the other ranks' chunks, the all-gather at this
 *                   rank's shard (an all-reduce uses both, disjoint). Algo sparse packs each
 *                   non-zero block's values on their own (a dense message: the shard packed),
 *                   without ef (a residual would make every touched block travel). Under
 *                   DEAR_DETERMINISTIC int8 is DEAR_ERR_UNSUPPORTED (a sum would depend on its
 *                   owner).
 */
#ifndef DEAR_COLL_H
#define DEAR_COLL_H

#include <mpi.h>
#include <stddef.h>

#include "base/algo_table.h"
#include "collectives/mem.h"
#include "collectives/net.h"
#include "include/dear_types.h"

/* The hosts of a communicator (coll_topo.c), for the hierarchical algorithm: H hosts of L ranks
 * each, communicators inside this rank's host (rank = local index) and across the hosts, and
 * rank_of[host * L + local], with its inverse host_of[rank] and local_of[rank]. Each comes twice, [0] for the reduce-scatter stages and [1] for the
 * all-gather stages, so that both can be in flight at once. Across the hosts: with 3 or more,
 * the ranks of this local index (rank = host index); with 2, duplicates of the communicator
 * itself (rank as there), whose exchange pairs ranks of different local indices (coll_hier.c).
 * Each communicator's messages go to its endpoint: MPI's until dear_coll_topo_attach. */
typedef struct {
    int nhosts, local_size;
    int host, local;            /* this rank's */
    MPI_Comm node[2], cross[2];
    const dear_net_t *node_net[2], *cross_net[2];
    int *rank_of, *host_of, *local_of;
    dear_net_t mpi_net[4];      /* the MPI endpoints of node[0], cross[0], node[1], cross[1] */
    dear_net_t *opened[4];      /* endpoints opened by dear_coll_topo_attach, closed at free */
} dear_coll_topo_t;

/* Collective over comm. host_id < 0: ranks sharing memory (MPI_Comm_split_type SHARED) are one
 * host; else ranks passing equal host_id are (tests build synthetic hosts this way). *topo is
 * NULL (and DEAR_OK) unless there are several hosts of the same number of ranks, at least two
 * each: the only layout the hierarchical algorithm serves. Free with dear_coll_topo_free. */
int dear_coll_topo_create(MPI_Comm comm, int host_id, dear_coll_topo_t **topo);
/* keep_comms: the communicators are left allocated, not freed (a communicator that may hold
 * unmatched messages must never be freed: MPI reuses its context id for a later communicator,
 * where those messages would match). */
void dear_coll_topo_free(dear_coll_topo_t *topo, int keep_comms);

/* Route the topology's four communicators through tp (whose base communicator holds them all):
 * an endpoint each, opened in one fixed order on every rank. NULL topo or the MPI transport:
 * nothing to do. On failure the MPI endpoints stay. */
int dear_coll_topo_attach(dear_coll_topo_t *topo, dear_transport_t *tp);

typedef struct {
    void *buf;      /* the block's full vector, count elements */
    size_t count;   /* sharding is over [0, count) */
    size_t lo, hi;  /* elements [lo, hi) travel; 0 <= lo <= hi <= count */
    float *ef;      /* int8 error feedback over the block's count elements (args.ef); NULL: none.
                     * Every block has one or none does */
} dear_coll_block_t;

typedef struct dear_coll_args {
    dear_coll_op_t op;
    dear_coll_algo_t algo;      /* DEAR_ALGO_AUTO: the selection table decides; a transport that runs
                                 * collectives itself (coll_start, net.h) always does */
    dear_dtype_t dtype;
    MPI_Comm comm;
    const dear_net_t *net;      /* comm on the transport carrying its messages; NULL: MPI */
    int tag;                    /* distinct among collectives in flight on comm; same on all ranks */
    double scale;               /* multiplies reduced elements; 1.0 for none */
    const void *sendbuf;        /* NULL or == recvbuf: in place */
    void *recvbuf;
    size_t count;               /* elements of the full vector */
    int nblocks;                /* > 0: multi-block reduce-scatter or all-gather; sendbuf/recvbuf/count
                                 * ignored */
    const dear_coll_block_t *blocks;
    const dear_coll_topo_t *topo; /* comm's hosts (NULL: flat); must outlive the request */
    size_t sparse_block;        /* elements per block for algo sparse (> 0 required there, e.g. a
                                 * tensor's row length); ignored by the dense algorithms */
    const dear_mem_ops_t *mem;  /* the memory row of the vectors (copies and reductions go through
                                 * it on the calling thread); NULL: host memory */
    dear_compress_t compress;   /* float32 vectors: the 16-bit format they travel in (an all-reduce's
                                 * reduce-scatter half); NONE, other types, one rank: as they are */
    dear_compress_t compress_ag; /* an all-reduce's all-gather half; ignored by the other ops */
    float *ef;                  /* int8 error feedback (compression above): a float32 per element of the
                                 * vector, zero at first, that the int8 phases read and leave what their
                                 * quantization dropped in (NULL: none; multi-block: blocks' ef) */
} dear_coll_args_t;

typedef struct dear_coll_req dear_coll_req_t;

/* What a finished or running collective did, for stats and the timeline. */
typedef struct {
    dear_coll_op_t op;
    dear_coll_algo_t algo;      /* the algorithm actually used */
    size_t bytes;               /* size of the full vector in bytes */
    size_t bytes_sent;          /* payload this rank sent so far */
    size_t events;              /* transfers completed so far: a progress loop backs off while
                                 * this stands still */
    size_t msgs_sparse;         /* algo sparse: messages this rank sent as non-zero pieces ... */
    size_t msgs_dense;          /* ... and as the dense shard (no smaller sparse); 0 otherwise */
} dear_coll_info_t;

/* The shard rule above. */
void dear_coll_shard(size_t count, int nranks, int rank, size_t *offset, size_t *len);
/* Rank p's piece of a block: its shard of the block's vector cut to [lo, hi); the count, 0 when
 * they do not meet, its first element at *at. */
size_t dear_coll_block_piece(const dear_coll_block_t *b, int nranks, int p, size_t *at);
/* Rank p's elements of a multi-block collective: its pieces of every block added up. */
size_t dear_coll_blocks_count(const dear_coll_block_t *blocks, int nblocks, int nranks, int p);
/* Ranks [p0, p1)'s pieces of blocks[0..nblocks), rank after rank and block after block, as a
 * staging vector in rank order holds them (rank p's from displs[p]): fn(arg, block, at, n, pos)
 * for each piece of n > 0 elements, from element `at` of the block's vector and `pos` of the
 * staging vector. Stops at the first non-zero return of fn and returns it. */
typedef int (*dear_coll_piece_fn)(void *arg, const dear_coll_block_t *b, size_t at, size_t n, size_t pos);
int dear_coll_blocks_each(const dear_coll_block_t *blocks, int nblocks, int nranks, const size_t *displs, int p0,
                          int p1, dear_coll_piece_fn fn, void *arg);

/* Blocks of sparse_block elements of vec (count elements of dtype) that are not all-bits-zero:
 * the zero-block scan of algo sparse, for density measurements and benchmarks. */
size_t dear_coll_sparse_nonzero(dear_dtype_t dtype, const void *vec, size_t count, size_t sparse_block);

/* How many times over a host's link carries algo sparse's exchange against the dense algorithm
 * that replaces it for op on a vector of `bytes` of dtype: for a reduce-scatter, the ranks per
 * host where that algorithm is hier, which crosses once per host after combining inside it,
 * while the exchange sends every rank's blocks across; 1 where it is flat (the ring: a host's
 * link then carries about what each rank sends), and for an all-gather, whose messages cross
 * once per host through a partner there. */
int dear_coll_sparse_copies(dear_coll_op_t op, dear_dtype_t dtype, size_t bytes, int nranks,
                            const dear_coll_topo_t *topo);

/* Validate args, pick the algorithm, post the first round (an out-of-place all-gather copies its
 * shard into place and posts in its first progress call instead). *req is set only on success.
 * Errors: DEAR_ERR_ARG (NULL buffer with count > 0, unknown type/op/algo, overlapping
 * out-of-place buffers, scale != 1 for int32, bad block range; also NULL args/req, MPI_COMM_NULL,
 * a tag outside [0, MPI_TAG_UB], a zero or non-finite scale for a reducing op, blocks with an op
 * other than all-gather, algo sparse with sparse_block 0), DEAR_ERR_NOMEM, DEAR_ERR_MPI,
 * DEAR_ERR_UNSUPPORTED (algo mpi beyond Open MPI's int counts, algo rhd beyond 2 GiB, algo direct
 * or sparse with a shard beyond 2 GiB). */
int dear_coll_start(const dear_coll_args_t *args, dear_coll_req_t **req);

/* Advance without blocking; *done becomes 1 when the result is in place. */
int dear_coll_progress(dear_coll_req_t *req, int *done);
/* The same, when the caller has just moved `polled`'s messages (dear_transport_progress) for
 * every request of this round: a request on it skips its own poll. Why: with several in flight,
 * one poll per request is one system call each that finds nothing new. */
int dear_coll_progress_polled(dear_coll_req_t *req, const dear_transport_t *polled, int *done);

/* Progress until done, backing off (yield, then short sleeps) instead of spinning. */
int dear_coll_wait(dear_coll_req_t *req);
/* The same for reqs[0..n) (n >= 1) until one of them has finished: its index in *which.
 * Collectives in flight together are advanced alike, as the progress thread does. */
int dear_coll_waitany(dear_coll_req_t *const *reqs, int n, int *which);
/* dear_coll_waitany bounded by deadline (seconds of dear_now): DEAR_ERR_TIMEOUT, the requests
 * left as they are, when none has finished by then. */
int dear_coll_waitany_until(dear_coll_req_t *const *reqs, int n, int *which, double deadline);

void dear_coll_get_info(const dear_coll_req_t *req, dear_coll_info_t *info);

/* The transport that every message of req travels on when it can sleep until they move
 * (dear_transport_block); NULL when some go through MPI, which only moves when polled (algo mpi
 * always does). */
dear_transport_t *dear_coll_transport(const dear_coll_req_t *req);

/* 1 when req's result is ordered on its transport's queue from the start (the transport runs
 * it, net.h coll_start): work enqueued there after the start sees it, before it completes. */
int dear_coll_queued(const dear_coll_req_t *req);

/* Free a finished request (or one whose start or progress failed). NULL is accepted. */
void dear_coll_free(dear_coll_req_t *req);

/* fn on every message of req that may still be outstanding (sub-collectives' included), for
 * error paths: a collective abandoned in flight has its receives cancelled and waited out
 * (dear_net_cancel, dear_net_test) before dear_coll_free frees the buffers they point at.
 * Inactive requests may be passed too; fn must ignore them. */
void dear_coll_each_req(dear_coll_req_t *req, dear_net_req_fn_t fn, void *arg);

/* The selection table: algorithm for op on nranks ranks and a vector of bytes, with the
 * communicator's hosts when known (NULL: flat). Honors DEAR_COLL_ALGO when it is not auto;
 * hier without a topology to serve falls back to ring. */
dear_coll_algo_t dear_coll_select(dear_coll_op_t op, size_t bytes, int nranks, const dear_coll_topo_t *topo);

/* The algorithm dear_coll_start runs for a dense float32 vector of count elements with algo
 * auto, both phases travelling in comp, on nranks ranks with these hosts over net (NULL: a host
 * transport): native where the transport runs its own collectives, else the selection table on
 * the bytes that travel, then what compression requires. The calibration times each size as it
 * will run and samples both sides of every change of algorithm. */
dear_coll_algo_t dear_coll_algo_for(dear_coll_op_t op, size_t count, dear_compress_t comp, int nranks,
                                    const dear_coll_topo_t *topo, const dear_net_t *net);

#endif

/*
 * Internal view of a collective request, shared by the dispatcher (coll.c) and the algorithm
 * files (coll_mpi.c, coll_ring.c, coll_rhd.c, coll_direct.c, coll_hier.c, coll_sparse.c). The dispatcher validates the arguments and
 * normalises every call to one of three shapes over a per-rank layout (counts[r], displs[r],
 * in elements), so an algorithm never sees multi-block all-gathers or out-of-place
 * all-gathers:
 *   REDUCE_SCATTER  src (total elements, never written) -> out (counts[rank] elements);
 *                   work (total elements) may be used as scratch for partial sums and may be
 *                   src itself (in place).
 *   ALLGATHER       in place on buf: rank r's part is buf[displs[r], +counts[r]).
 *   ALLREDUCE       src (total) -> buf (total); src == buf when in place. Only algorithms
 *                   without DEAR_ALGO_F_COMPOSED_AR see it: for the others the dispatcher runs
 *                   a REDUCE_SCATTER from src with work = buf and out = this rank's part of buf,
 *                   then an in-place ALLGATHER on buf.
 * Adding an algorithm means one file with one dear_coll_algo_ops_t and one row in
 * DEAR_COLL_ALGO_TABLE (base/algo_table.h).
 */
#ifndef DEAR_COLL_IMPL_H
#define DEAR_COLL_IMPL_H

#include <stddef.h>

#include "collectives/coll.h"
#include "collectives/mem.h"
#include "collectives/net.h"

typedef struct dear_coll_algo_ops {
    const char *name;
    /* Post the first round. On error the request is freed through cleanup. */
    int (*start)(dear_coll_req_t *req);
    /* Bounded, non-blocking step; *done = 1 when the result is in place. */
    int (*progress)(dear_coll_req_t *req, int *done);
    /* Free algorithm state (abandoning requests still outstanding). */
    void (*cleanup)(dear_coll_req_t *req);
    /* Optional: fn on each of its messages, its sub-collectives' included (dear_coll_each_req).
     * An algorithm whose messages are all its own copies (mpi) or run on a queue (native) has
     * none. */
    void (*each_req)(dear_coll_req_t *req, dear_net_req_fn_t fn, void *arg);
} dear_coll_algo_ops_t;

/* cleanup's first step: every message of req abandoned (each_req with this). */
static inline void dear_coll_abandon_one(dear_net_req_t *q, void *arg)
{
    (void)arg;
    dear_net_abandon(q);
}

struct dear_coll_req {
    dear_coll_op_t user_op;     /* what the caller asked for */
    dear_coll_op_t op;          /* what the algorithm runs now: user_op, or a composed
                                 * all-reduce's current half */
    int composed;               /* an all-reduce run as reduce-scatter then all-gather */
    dear_dtype_t user_dtype;    /* the caller's; dtype is DEAR_FLOAT32 while a 16-bit reduction runs
                                 * on the float32 copy below */
    float *wide;                /* that copy (coll.c's widen_setup), or NULL */
    size_t wide_cap;
    void *narrow_to;            /* where its result is rounded to, from narrow_from */
    const float *narrow_from;
    size_t narrow_count;
    char *saved_buf;            /* buf while the copy runs */
    /* Compression (coll.h): the algorithm runs on a 16-bit copy of the vector (wire, from the
     * scratch cache), with dtype the 16-bit type, and wire16 set. */
    int wire16;                 /* partial sums travel in dtype, rounded at each hop, never widened */
    const float *src32;         /* reduce-scatter, all-reduce: the float32 input, indexed as src
                                 * (NULL: none); an algorithm may add the own share from it,
                                 * unrounded */
    float *out32;               /* reduce-scatter of an algorithm with DEAR_ALGO_F_WIRE32: where its
                                 * float32 result goes, indexed as out; set, the algorithm writes its
                                 * result there and not to out (NULL: to out, in dtype) */
    int wire_lazy;              /* the 16-bit copy is unfilled: the algorithm rounds what it sends
                                 * of src32 (DEAR_ALGO_F_PACKS16) */
    dear_compress_t comp_ag;    /* composed all-reduce: the all-gather half's format */
    int q8;                     /* the phase travels as int8 (coll_direct.c, coll_hier.c across
                                 * the hosts; buffers stay float32) */
    float *ef;                  /* int8 error feedback, indexed as the vector (NULL: none): what
                                 * this rank's quantizations dropped, the peers' chunks by the
                                 * reduce-scatter, its own shard by the all-gather */
    char *wire;                 /* the 16-bit vector (total elements) while a phase runs on it */
    size_t wire_cap;
    struct {                    /* the caller's float32 view, restored when the phase ends */
        const char *src;
        char *work, *out, *buf;
        int in_place;
    } wsave;
    dear_coll_algo_t algo;
    dear_dtype_t dtype;
    MPI_Comm comm;
    const dear_net_t *net;      /* comm on its transport: the caller's, or mpi_net */
    dear_net_t mpi_net;
    int tag, rank, nranks;
    size_t esize;
    double scale;

    /* Normalised layout (see the top of this file). */
    size_t total;
    size_t *counts, *displs;    /* nranks entries each, elements */
    const char *src;            /* RS, AR: input vector */
    char *work;                 /* RS: scratch of total elements (may be == src) */
    char *out;                  /* RS: this rank's result */
    char *buf;                  /* AG, AR: the full vector */
    int in_place;
    char *scratch;              /* from dear_coll_scratch_get (returned in dear_coll_free) */
    size_t scratch_bytes;

    /* Multi-block reduce-scatter or all-gather through a staging buffer (NULL when it runs in
     * place). */
    int nblocks;
    dear_coll_block_t *blocks;
    char *staging;
    float *ef_staging;          /* the blocks' error feedback, packed alike (int8) */

    const char *ag_send;        /* out-of-place all-gather: shard still to copy into buf */
    int started;                /* the algorithm's start has run */
    int done;
    int failed;
    size_t bytes_sent;
    size_t msgs_sparse, msgs_dense; /* algo sparse: the form of each message sent */
    size_t block;               /* algo sparse: elements per block */
    size_t events;              /* completed transfers, for back-off decisions */
    const dear_coll_algo_ops_t *ops;
    void *state;                /* the algorithm's */
    const dear_coll_topo_t *topo; /* hier: the communicator's hosts */
    const dear_mem_ops_t *mem;  /* the row of the memory the vectors lie in (host-accessible) */
    dear_coll_args_t native_args; /* algo native: the caller's arguments, for the transport */
    int sub;                    /* a step of another request, which moves the transport for it */
};

/* Each row of DEAR_COLL_ALGO_TABLE (base/algo_table.h) names its ops, defined in its file. */
#define DEAR_ALGO_OPS_DECL_(ID, NAME, OPS, FLAGS, HELP) extern const dear_coll_algo_ops_t OPS;
DEAR_COLL_ALGO_TABLE(DEAR_ALGO_OPS_DECL_)
#undef DEAR_ALGO_OPS_DECL_

/* A collective of another algorithm run as a step of parent's (hier), or instead of it (sparse
 * on dense data): op over the nranks ranks of
 * net (this one rank), chunk p of rank p at counts[p]/displs[p] (copied) of the vector vec: a
 * reduce-scatter reads the input src (vec itself, or another vector of the same layout), works
 * in vec and writes this rank's result to out (vec + displs[rank] or elsewhere); an all-gather
 * fills vec in place. Parent's type, tag and hosts (topo). Started; advance with
 * dear_coll_progress, free with dear_coll_free. */
int dear_coll_sub_start(const dear_coll_req_t *parent, dear_coll_op_t op, dear_coll_algo_t algo, const dear_net_t *net,
                        int rank, int nranks, const size_t *counts, const size_t *displs, const char *src,
                        char *vec, char *out, double scale, dear_coll_req_t **sub);
/* The same for a compressed parent (wire16 inherited): a reduce-scatter step that adds the
 * parent's own float32 input reads src32 (indexed as src; NULL: src), and the step that makes
 * the parent's result writes it to out32 (indexed as out; NULL: into out, in dtype). q8: the
 * step travels as int8 (algo direct only), with the parent's error feedback (indexed as vec). */
int dear_coll_sub_start32(const dear_coll_req_t *parent, dear_coll_op_t op, dear_coll_algo_t algo,
                          const dear_net_t *net, int rank, int nranks, const size_t *counts, const size_t *displs,
                          const char *src, const float *src32, char *vec, char *out, float *out32, double scale,
                          int q8, dear_coll_req_t **sub);

/* The request's element operations, through its memory row on the calling thread (queue NULL,
 * which a row the host can access runs at once and without failing). */
static inline void coll_copy(const dear_coll_req_t *r, void *dst, const void *src, size_t bytes)
{
    (void)r->mem->copy(NULL, dst, src, bytes);
}
static inline void coll_sum(const dear_coll_req_t *r, dear_dtype_t t, void *dst, const void *a, const void *b, size_t n,
                            double s)
{
    (void)r->mem->sum(NULL, t, dst, a, b, n, s);
}
static inline void coll_scale(const dear_coll_req_t *r, dear_dtype_t t, void *dst, const void *src, size_t n, double s)
{
    (void)r->mem->scale(NULL, t, dst, src, n, s);
}
static inline void coll_widen(const dear_coll_req_t *r, dear_dtype_t t, float *dst, const void *src, size_t n)
{
    (void)r->mem->widen(NULL, t, dst, src, n);
}
static inline void coll_widen_acc(const dear_coll_req_t *r, dear_dtype_t t, float *acc, const void *src, size_t n)
{
    (void)r->mem->widen_acc(NULL, t, acc, src, n);
}
static inline void coll_narrow(const dear_coll_req_t *r, dear_dtype_t t, void *dst, const float *src, size_t n,
                               double s)
{
    (void)r->mem->narrow(NULL, t, dst, src, n, s);
}

/* Compressed reduction (r->wire16), n elements: float32(b16) plus this rank's addend (a32 when
 * given, its own float32 input; else float32(a16)), times s, into dst32 when given, else rounded
 * into dst16. dst16 may be a16, dst32 a32 (the same elements). */
void coll_wire_add(const dear_coll_req_t *r, void *dst16, float *dst32, const void *a16, const float *a32,
                   const void *b16, size_t n, double s);
/* A reduce-scatter's last step: sum (this rank's n result elements, in dtype) times the scale,
 * into out, or when compressed into out32 (widened, then scaled in float32). sum may be out. */
void coll_rs_final(const dear_coll_req_t *r, const void *sum, size_t n);

/* MPI datatype that moves one element of dtype (16-bit types as MPI_UINT16_T). */
MPI_Datatype dear_coll_mpi_type(dear_dtype_t dtype);
/* MPI's sum of dtype: MPI_SUM, or for a 16-bit type an operation of our own that adds in float32
 * and rounds once (created on first use; MPI_OP_NULL, logged, when that fails). */
MPI_Op dear_coll_mpi_sum(dear_dtype_t dtype);

/* Large scratch vectors (an out-of-place ring reduce-scatter's partial sums) come from a small
 * process-wide cache, so repeated calls do not pay page faults on fresh memory each time.
 * Thread-safe. get returns NULL (after logging) when allocation fails. */
void *dear_coll_scratch_get(size_t bytes, size_t *capacity);
void dear_coll_scratch_put(void *p, size_t capacity);

#endif

/*
 * The collective operations and the table of collective algorithms: the vocabulary that the
 * collectives (which run them), the cost model and the simulator (which price them) and the
 * runtime (which picks them) share. Kept in base/ so that fusion/, beside collectives/, can name
 * them without depending on it.
 *
 * DEAR_COLL_ALGO_TABLE(X) has one row per algorithm, in the order of dear_coll_algo_t:
 *     X(ID, "name", OPS, FLAGS, "help")
 *   ID     enum suffix: DEAR_ALGO_<ID>
 *   OPS    the algorithm's dear_coll_algo_ops_t (collectives/coll_impl.h); only collectives/
 *          expands this column
 *   FLAGS  DEAR_ALGO_F_*
 *   help   one line for DEAR_COLL_ALGO's help and the tools
 * Every enum, name list, accepted-values text and tool list is generated from it; adding an
 * algorithm is one file in collectives/ and one row here (docs/HACKING.md).
 */
#ifndef DEAR_ALGO_TABLE_H
#define DEAR_ALGO_TABLE_H

/* The three collectives; the cost model and the simulator price the same three. */
typedef enum {
    DEAR_COLL_REDUCE_SCATTER = 0,
    DEAR_COLL_ALLGATHER = 1,
    DEAR_COLL_ALLREDUCE = 2,
    DEAR_COLL_OP_COUNT
} dear_coll_op_t;

/* The algorithm has no all-reduce of its own: the dispatcher runs its reduce-scatter, then its
 * all-gather, on the same vector. */
#define DEAR_ALGO_F_COMPOSED_AR 0x1
/* Needs the communicator's hosts (dear_coll_topo_t) in a shape it serves; else ring runs. */
#define DEAR_ALGO_F_NEEDS_HOSTS 0x2
/* Sums 16-bit floating types itself with float32 partial sums, rounded once. Without it the
 * dispatcher runs the algorithm's reductions of those types on a float32 copy (twice the bytes
 * on the wire) and rounds the result once. */
#define DEAR_ALGO_F_EXACT16 0x4
/* Needs a block size (dear_coll_args_t.sparse_block > 0): asked for explicitly without one it is
 * an argument error; forced through DEAR_COLL_ALGO onto a collective without one, ring runs. */
#define DEAR_ALGO_F_NEEDS_BLOCK 0x8
/* The transport's own collectives (NCCL on device memory): taken whenever the transport runs
 * collectives itself, never otherwise (forced elsewhere, ring runs). */
#define DEAR_ALGO_F_NATIVE 0x10
/* A compressed reduce-scatter writes its float32 result itself (out32, coll_impl.h), never
 * rounded after the last addition. Without it the dispatcher widens the 16-bit result. */
#define DEAR_ALGO_F_WIRE32 0x20
/* A compressed reduce-scatter rounds what it sends of its own input itself (from src32): the
 * dispatcher leaves the 16-bit copy unfilled (wire_lazy) instead of packing the whole vector. */
#define DEAR_ALGO_F_PACKS16 0x40

#define DEAR_COLL_ALGO_TABLE(X)                                                                \
    X(RING, "ring", dear_coll_ring_ops,                                                        \
      DEAR_ALGO_F_COMPOSED_AR | DEAR_ALGO_F_EXACT16 | DEAR_ALGO_F_WIRE32 | DEAR_ALGO_F_PACKS16, \
      "pipelined ring: bandwidth-optimal, reduction overlapped with transfer")                \
    X(RHD, "rhd", dear_coll_rhd_ops, DEAR_ALGO_F_WIRE32, "recursive halving/doubling: log2(P) rounds") \
    X(MPI, "mpi", dear_coll_mpi_ops, DEAR_ALGO_F_WIRE32, "the MPI library's own non-blocking collectives") \
    X(DIRECT, "direct", dear_coll_direct_ops,                                                  \
      DEAR_ALGO_F_COMPOSED_AR | DEAR_ALGO_F_EXACT16 | DEAR_ALGO_F_WIRE32,                      \
      "all-to-all exchange, one round per phase")                                             \
    X(HIER, "hier", dear_coll_hier_ops, DEAR_ALGO_F_NEEDS_HOSTS | DEAR_ALGO_F_WIRE32,          \
      "two levels, pipelined in segments: inside each host over shared memory, across hosts") \
    X(SPARSE, "sparse", dear_coll_sparse_ops,                                                  \
      DEAR_ALGO_F_COMPOSED_AR | DEAR_ALGO_F_EXACT16 | DEAR_ALGO_F_NEEDS_BLOCK | DEAR_ALGO_F_WIRE32, \
      "block-sparse exchange: only non-zero blocks travel, dense per message when no smaller") \
    X(NATIVE, "native", dear_coll_native_ops, DEAR_ALGO_F_NATIVE,                              \
      "the transport's own collectives (NCCL on device memory), ordered on its stream")

/* DEAR_ALGO_AUTO asks the selection table (collectives/coll.c) to choose. */
typedef enum {
    DEAR_ALGO_AUTO = 0,
#define DEAR_ALGO_ENUM_(ID, NAME, OPS, FLAGS, HELP) DEAR_ALGO_##ID,
    DEAR_COLL_ALGO_TABLE(DEAR_ALGO_ENUM_)
#undef DEAR_ALGO_ENUM_
    DEAR_ALGO_COUNT
} dear_coll_algo_t;

/* "auto|ring|rhd|...": DEAR_COLL_ALGO's choices, in enum order. */
#define DEAR_ALGO_CHOICE_(ID, NAME, OPS, FLAGS, HELP) "|" NAME
#define DEAR_COLL_ALGO_CHOICES "auto" DEAR_COLL_ALGO_TABLE(DEAR_ALGO_CHOICE_)

/* "reduce_scatter", ... (logs, timeline); "rs", "ag", "ar" (files, tables); "unknown" if out of
 * range. The short parse returns 0 and sets *op, or -1. */
const char *dear_coll_op_name(dear_coll_op_t op);
const char *dear_coll_op_short(dear_coll_op_t op);
int dear_coll_op_parse(const char *shortname, dear_coll_op_t *op);
/* "auto", "ring", ...; "unknown" if out of range. parse returns 0 and sets *algo, or -1. */
const char *dear_coll_algo_name(dear_coll_algo_t algo);
int dear_coll_algo_parse(const char *name, dear_coll_algo_t *algo);
/* DEAR_ALGO_F_* of an algorithm (0 for auto or out of range). */
unsigned dear_coll_algo_flags(dear_coll_algo_t algo);
const char *dear_coll_algo_help(dear_coll_algo_t algo);

#endif

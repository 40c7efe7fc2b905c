/*
 * The collective dispatcher: argument validation, the selection table, the algorithm table,
 * and the normalisation every algorithm relies on (coll_impl.h): the shard layout, out-of-place
 * all-gathers turned in place by copying this rank's shard, and multi-block reduce-scatters and
 * all-gathers packed into one staging vector (or run in place when there is a single block). The algorithms
 * themselves live one per file.
 */
#include "collectives/coll.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/sync.h"
#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "base/mpi_check.h"
#include "base/log.h"
#include "base/params.h"
#include "base/util.h"

/* Indexed by dear_coll_algo_t (AUTO resolves through dear_coll_select first). */
#define ALGO_OPS_(ID, NAME, OPS, FLAGS, HELP) [DEAR_ALGO_##ID] = &OPS,
static const dear_coll_algo_ops_t *const algo_table[DEAR_ALGO_COUNT] = {
    [DEAR_ALGO_AUTO] = NULL,
    DEAR_COLL_ALGO_TABLE(ALGO_OPS_)
};
#undef ALGO_OPS_

/* The selection table (figures: docs/PERFORMANCE.md#selection-table), for communicators hier
 * does not fit (see hier below). From 2 to DIRECT_MAX_RANKS ranks: the direct exchange up to
 * direct_max[multihost][op] bytes (one round instead of P-1), the pipelined ring above it
 * (overlaps reduction with transfer, one flow per link). Row 1, a
 * communicator over several hosts, keeps reduce-scatters and larger all-gathers and all-reduces
 * on the ring: P-1 senders converging on each receiver's link lose to it there. Above
 * DIRECT_MAX_RANKS (not measured) rhd up to rhd_max[pow2 ? 0 : 1], the ring above.
 * Whether the communicator spans hosts is read without communication, so every rank decides
 * alike (different algorithms on different ranks would hang): a communicator of the job's size
 * spans several hosts when the job's ranks on this host (OMPI_COMM_WORLD_LOCAL_SIZE / _SIZE;
 * MPICH's MPI_LOCALNRANKS / PMI_SIZE) are fewer than all; any other communicator gets row 0.
 * (MPI_Comm_split_type would tell exactly, but dear_coll_start must not make collective calls.) */
#define DIRECT_MAX_RANKS 8
static const size_t direct_max[2][DEAR_COLL_OP_COUNT] = {
    { [DEAR_COLL_REDUCE_SCATTER] = 1 << 20, [DEAR_COLL_ALLGATHER] = 1 << 20, [DEAR_COLL_ALLREDUCE] = 1 << 20 },
    { [DEAR_COLL_REDUCE_SCATTER] = 0, [DEAR_COLL_ALLGATHER] = 64 << 10, [DEAR_COLL_ALLREDUCE] = 256 << 10 },
};
static const size_t rhd_max[2][DEAR_COLL_OP_COUNT] = {
    { [DEAR_COLL_REDUCE_SCATTER] = 65536, [DEAR_COLL_ALLGATHER] = 16384, [DEAR_COLL_ALLREDUCE] = 65536 },
    { [DEAR_COLL_REDUCE_SCATTER] = 0, [DEAR_COLL_ALLGATHER] = 0, [DEAR_COLL_ALLREDUCE] = 65536 },
};

/* Several hosts of several ranks each: two levels (coll_hier.c) at every size. They carry
 * (H-1)/H of the vector over each host's link, where the flat ring carries (P-1)/P and the direct
 * exchange L times that, and their segments keep the link busy while the hosts reduce and
 * gather. Timed as streams, as the runtime runs a phase, their extra round inside the host
 * costs less than those bytes from 1 KiB up (docs/PERFORMANCE.md#hier). */

static long env_long(const char *name)
{
    const char *v = getenv(name);
    return v != NULL ? strtol(v, NULL, 10) : 0;
}

/* 1 when a communicator of nranks ranks spans several hosts, as far as every rank can tell the
 * same way (see above); read on every call, so that a test can set the variables. */
static int spans_hosts(int nranks)
{
    long world = env_long("OMPI_COMM_WORLD_SIZE"), local = env_long("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (world <= 0 || local <= 0) {
        world = env_long("PMI_SIZE");
        local = env_long("MPI_LOCALNRANKS");
    }
    return world > 0 && local > 0 && nranks == world && local < world;
}

/* 1 when topo describes the hosts of a communicator of nranks ranks in a shape hier serves. */
static int hier_fits(const dear_coll_topo_t *topo, int nranks)
{
    return topo != NULL && topo->nhosts >= 2 && topo->nhosts <= 64 && topo->local_size >= 2 &&
           topo->nhosts * topo->local_size == nranks;
}

dear_coll_algo_t dear_coll_select(dear_coll_op_t op, size_t bytes, int nranks, const dear_coll_topo_t *topo)
{
    /* DEAR_DETERMINISTIC: the one exchange that sums every element in rank order. */
    if (dear_param_int(DEAR_P_DETERMINISTIC))
        return DEAR_ALGO_DIRECT;
    /* DEAR_COLL_ALGO's choices are the algorithm table in enum order (base/algo_table.h). */
    dear_coll_algo_t forced = (dear_coll_algo_t)dear_param_enum(DEAR_P_COLL_ALGO);
    if (forced > DEAR_ALGO_AUTO && forced < DEAR_ALGO_COUNT) {
        unsigned f = dear_coll_algo_flags(forced);
        int unfit = ((f & DEAR_ALGO_F_NEEDS_HOSTS) && !hier_fits(topo, nranks)) || (f & DEAR_ALGO_F_NATIVE);
        return unfit ? DEAR_ALGO_RING : forced;
    }
    if (nranks <= 1 || (unsigned)op >= DEAR_COLL_OP_COUNT)
        return DEAR_ALGO_RING;  /* nothing travels */
    if (hier_fits(topo, nranks))
        return DEAR_ALGO_HIER;
    if (nranks <= DIRECT_MAX_RANKS)
        return bytes <= direct_max[spans_hosts(nranks)][op] ? DEAR_ALGO_DIRECT : DEAR_ALGO_RING;
    int pow2 = (nranks & (nranks - 1)) == 0;
    return bytes <= rhd_max[pow2 ? 0 : 1][op] ? DEAR_ALGO_RHD : DEAR_ALGO_RING;
}

MPI_Datatype dear_coll_mpi_type(dear_dtype_t dtype)
{
    switch (dtype) {
    case DEAR_FLOAT32: return MPI_FLOAT;
    case DEAR_FLOAT64: return MPI_DOUBLE;
    case DEAR_BFLOAT16:
    case DEAR_FLOAT16: return MPI_UINT16_T;
    case DEAR_INT32: return MPI_INT32_T;
    }
    return MPI_DATATYPE_NULL;
}

/* Two cached vectors: enough for one reduce-scatter per phase in flight; others allocate. */
static pthread_mutex_t scratch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t bytes; } scratch_cache[2];

void *dear_coll_scratch_get(size_t bytes, size_t *capacity)
{
    void *p = NULL;
    int best = -1;
    dear_lock(&scratch_mu);
    for (int i = 0; i < 2; i++)
        if (scratch_cache[i].p != NULL && scratch_cache[i].bytes >= bytes &&
            (best < 0 || scratch_cache[i].bytes < scratch_cache[best].bytes))
            best = i;
    if (best >= 0) {
        p = scratch_cache[best].p;
        *capacity = scratch_cache[best].bytes;
        scratch_cache[best].p = NULL;
    }
    dear_unlock(&scratch_mu);
    if (p != NULL)
        return p;
    p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        DEAR_ERROR("sys", "allocation of %zu bytes of collective scratch failed", bytes);
    *capacity = bytes;
    return p;
}

void dear_coll_scratch_put(void *p, size_t capacity)
{
    if (p == NULL)
        return;
    dear_lock(&scratch_mu);
    /* Keep the largest vectors: an empty slot first, else replace a smaller one. */
    int slot = -1;
    for (int i = 0; i < 2 && slot < 0; i++)
        if (scratch_cache[i].p == NULL)
            slot = i;
    for (int i = 0; i < 2 && slot < 0; i++)
        if (scratch_cache[i].bytes < capacity)
            slot = i;
    void *evict = p;
    if (slot >= 0) {
        evict = scratch_cache[slot].p;
        scratch_cache[slot].p = p;
        scratch_cache[slot].bytes = capacity;
    }
    dear_unlock(&scratch_mu);
    free(evict);
}

static int ranges_overlap(const void *a, size_t abytes, const void *b, size_t bbytes)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    if (abytes == 0 || bbytes == 0)
        return 0;
    return a0 < b0 + bbytes && b0 < a0 + abytes;
}

/* Every check of coll.h, each with a message naming the argument and what is accepted. */
static int validate(const dear_coll_args_t *a, int *rank, int *nranks)
{
    DEAR_ARG_CHECK(a != NULL, "dear_coll_start: args is NULL");
    DEAR_ARG_CHECK((unsigned)a->op < DEAR_COLL_OP_COUNT,
                   "dear_coll_start: unknown op %d (accepted: 0 reduce_scatter, 1 allgather, 2 allreduce)",
                   (int)a->op);
    DEAR_ARG_CHECK((unsigned)a->algo < DEAR_ALGO_COUNT,
                   "dear_coll_start: unknown algo %d (accepted: 0 .. %d, one of %s in this order)", (int)a->algo,
                   DEAR_ALGO_COUNT - 1, DEAR_COLL_ALGO_CHOICES);
    DEAR_ARG_CHECK((unsigned)a->dtype < DEAR_DTYPE_COUNT,
                   "dear_coll_start: unknown dtype %d (accepted: float32, float64, bfloat16, float16, int32)",
                   (int)a->dtype);
    DEAR_ARG_CHECK((unsigned)a->compress < DEAR_COMPRESS_COUNT && (unsigned)a->compress_ag < DEAR_COMPRESS_COUNT,
                   "dear_coll_start: unknown compress %d or compress_ag %d (accepted: 0 none, 1 bf16, 2 fp16, 3 int8)",
                   (int)a->compress, (int)a->compress_ag);
    DEAR_ARG_CHECK(!(dear_coll_algo_flags(a->algo) & DEAR_ALGO_F_NEEDS_BLOCK) || a->sparse_block > 0,
                   "dear_coll_start: algo %s with sparse_block 0 (accepted: elements per block > 0, e.g. a "
                   "tensor's row length)", dear_coll_algo_name(a->algo));
    DEAR_ARG_CHECK(a->comm != MPI_COMM_NULL, "dear_coll_start: comm is MPI_COMM_NULL");
    DEAR_ARG_CHECK(a->mem == NULL || (a->mem->flags & DEAR_MEM_F_HOST_ACCESS),
                   "dear_coll_start: the vectors lie in %s memory, which the host cannot access (accepted: a row with "
                   "DEAR_MEM_F_HOST_ACCESS, such as host memory; device memory goes through its transport)",
                   a->mem ? a->mem->name : "?");
    DEAR_ARG_CHECK(a->tag >= 0, "dear_coll_start: tag %d is negative (accepted: 0 .. MPI_TAG_UB)", a->tag);
    int *ub = NULL, has_ub = 0;
    DEAR_MPI_CHECK(MPI_Comm_get_attr(a->comm, MPI_TAG_UB, &ub, &has_ub));
    DEAR_ARG_CHECK(!has_ub || a->tag <= *ub, "dear_coll_start: tag %d exceeds MPI_TAG_UB %d", a->tag,
                   has_ub ? *ub : 0);
    /* An all-gather reduces nothing, so its scale is ignored; a zero scale elsewhere is almost
     * surely an args struct left zero-initialised. */
    int reduces = a->op != DEAR_COLL_ALLGATHER;
    DEAR_ARG_CHECK(!reduces || (isfinite(a->scale) && a->scale != 0.0),
                   "dear_coll_start: scale %g is not a finite non-zero number (1.0 for none)", a->scale);
    DEAR_ARG_CHECK(!reduces || a->dtype != DEAR_INT32 || a->scale == 1.0,
                   "dear_coll_start: scale %g given for int32 (accepted: 1 only)", a->scale);
    DEAR_MPI_CHECK(MPI_Comm_rank(a->comm, rank));
    DEAR_MPI_CHECK(MPI_Comm_size(a->comm, nranks));
    size_t es = dear_dtype_size(a->dtype);
    DEAR_ARG_CHECK(a->nblocks >= 0, "dear_coll_start: nblocks %d is negative", a->nblocks);
    if (a->nblocks > 0) {
        DEAR_ARG_CHECK(a->op == DEAR_COLL_ALLGATHER || a->op == DEAR_COLL_REDUCE_SCATTER,
                       "dear_coll_start: nblocks %d given for %s (accepted: reduce-scatter and allgather only)",
                       a->nblocks, dear_coll_op_name(a->op));
        DEAR_ARG_CHECK(a->blocks != NULL, "dear_coll_start: nblocks %d but blocks is NULL", a->nblocks);
        for (int b = 0; b < a->nblocks; b++) {
            const dear_coll_block_t *bl = &a->blocks[b];
            DEAR_ARG_CHECK(bl->lo <= bl->hi && bl->hi <= bl->count,
                           "dear_coll_start: block %d range [%zu, %zu) is not within [0, %zu)", b, bl->lo,
                           bl->hi, bl->count);
            DEAR_ARG_CHECK(bl->count <= SIZE_MAX / es, "dear_coll_start: block %d count %zu overflows", b,
                           bl->count);
            DEAR_ARG_CHECK(bl->buf != NULL || bl->hi == bl->lo,
                           "dear_coll_start: block %d buf is NULL with %zu elements that travel", b,
                           bl->hi - bl->lo);
            DEAR_ARG_CHECK((bl->ef != NULL) == (a->blocks[0].ef != NULL),
                           "dear_coll_start: block %d has %s error feedback vector and block 0 %s (accepted: "
                           "every block one, or none)", b, bl->ef ? "an" : "no", a->blocks[0].ef ? "has" : "has not");
        }
        return DEAR_OK;
    }
    DEAR_ARG_CHECK(a->count <= SIZE_MAX / es / 2, "dear_coll_start: count %zu is too large", a->count);
    DEAR_ARG_CHECK(a->recvbuf != NULL || a->count == 0,
                   "dear_coll_start: recvbuf is NULL with count %zu (accepted: NULL only when count is 0)",
                   a->count);
    int in_place = a->sendbuf == NULL || a->sendbuf == a->recvbuf;
    if (!in_place) {
        size_t off, len, sbytes, rbytes;
        dear_coll_shard(a->count, *nranks, *rank, &off, &len);
        switch (a->op) {
        case DEAR_COLL_REDUCE_SCATTER: sbytes = a->count * es; rbytes = len * es; break;
        case DEAR_COLL_ALLGATHER: sbytes = len * es; rbytes = a->count * es; break;
        default: sbytes = rbytes = a->count * es; break;
        }
        DEAR_ARG_CHECK(!ranges_overlap(a->sendbuf, sbytes, a->recvbuf, rbytes),
                       "dear_coll_start: %s out of place with overlapping sendbuf (%zu bytes) and recvbuf "
                       "(%zu bytes) (accepted: disjoint buffers, or sendbuf NULL / == recvbuf for in place)",
                       dear_coll_op_name(a->op), sbytes, rbytes);
    }
    return DEAR_OK;
}

/* counts/displs of the shard rule over count elements. */
static void shard_layout(dear_coll_req_t *r, size_t count)
{
    for (int p = 0; p < r->nranks; p++)
        dear_coll_shard(count, r->nranks, p, &r->displs[p], &r->counts[p]);
    r->total = count;
}

typedef struct {
    dear_coll_req_t *r;
    int to_staging, ef;
} blocks_copy_arg_t;

static int blocks_copy_piece(void *arg, const dear_coll_block_t *b, size_t at, size_t n, size_t pos)
{
    const blocks_copy_arg_t *c = arg;
    size_t es = c->ef ? sizeof(float) : c->r->esize;
    char *st = (c->ef ? (char *)c->r->ef_staging : c->r->staging) + pos * es;
    char *blk = (c->ef ? (char *)b->ef : (char *)b->buf) + at * es;
    coll_copy(c->r, c->to_staging ? st : blk, c->to_staging ? blk : st, n * es);
    return 0;
}

/* Copy the pieces of ranks [p0, p1) between the blocks and the staging vector (to_staging: into
 * it); ef: the blocks' error feedback vectors and ef_staging instead. A block with nothing that
 * travels may have a NULL buf. */
static void blocks_copy_of(dear_coll_req_t *r, int p0, int p1, int to_staging, int ef)
{
    blocks_copy_arg_t c = { r, to_staging, ef };
    (void)dear_coll_blocks_each(r->blocks, r->nblocks, r->nranks, r->displs, p0, p1, blocks_copy_piece, &c);
}

static void blocks_copy(dear_coll_req_t *r, int p0, int p1, int to_staging)
{
    blocks_copy_of(r, p0, p1, to_staging, 0);
}

/* The residuals an int8 phase reads and writes, between the blocks and ef_staging: a
 * reduce-scatter's at the other ranks' pieces, an all-gather's at this rank's. Only those, so
 * that a phase never writes back residuals another phase owns. */
static void blocks_copy_ef(dear_coll_req_t *r, int to_staging)
{
    if (r->user_op == DEAR_COLL_ALLGATHER) {
        blocks_copy_of(r, r->rank, r->rank + 1, to_staging, 1);
        return;
    }
    blocks_copy_of(r, 0, r->rank, to_staging, 1);
    blocks_copy_of(r, r->rank + 1, r->nranks, to_staging, 1);
}

/* Multi-block collectives: rank p's shard is, block after block, its shard of each block cut to
 * [lo, hi). One block runs in place (its pieces are adjacent in rank order); several go through
 * a staging vector in rank order, packed here (an all-gather packs this rank's pieces, a
 * reduce-scatter every rank's) and unpacked by blocks_unpack. */
static int blocks_layout(dear_coll_req_t *r, const dear_coll_args_t *a)
{
    int rc = DEAR_OK;
    size_t total = 0;
    for (int p = 0; p < r->nranks; p++) {
        size_t c = dear_coll_blocks_count(a->blocks, a->nblocks, r->nranks, p);
        r->counts[p] = c;
        r->displs[p] = total;
        total += c;
    }
    r->total = total;
    r->nblocks = a->nblocks;
    if (a->nblocks == 1) {
        r->buf = (char *)a->blocks[0].buf + a->blocks[0].lo * r->esize;
        r->ef = a->blocks[0].ef != NULL ? a->blocks[0].ef + a->blocks[0].lo : NULL;
        return DEAR_OK;
    }
    size_t nb = (size_t)a->nblocks * sizeof(dear_coll_block_t);
    DEAR_ALLOC_GOTO(r->blocks, malloc(nb), nb, rc, out);
    memcpy(r->blocks, a->blocks, nb);
    DEAR_ALLOC_GOTO(r->staging, malloc(total * r->esize + 1), total * r->esize + 1, rc, out);
    r->buf = r->staging;
    if (a->op == DEAR_COLL_REDUCE_SCATTER)
        blocks_copy(r, 0, r->nranks, 1);
    else
        blocks_copy(r, r->rank, r->rank + 1, 1);
    /* int8 error feedback travels with the pieces its phase quantizes (multi-block collectives
     * are reduce-scatters and all-gathers, never all-reduces). */
    if (a->blocks[0].ef != NULL) {
        DEAR_ALLOC_GOTO(r->ef_staging, malloc(total * sizeof(float) + 1), total * sizeof(float) + 1, rc, out);
        blocks_copy_ef(r, 1);
        r->ef = r->ef_staging;
    }
out:
    return rc;
}

/* Back from the staging vector: every rank's pieces after an all-gather, this rank's after a
 * reduce-scatter (the only ones it holds reduced). */
static void blocks_unpack(dear_coll_req_t *r)
{
    if (r->user_op == DEAR_COLL_REDUCE_SCATTER)
        blocks_copy(r, r->rank, r->rank + 1, 0);
    else
        blocks_copy(r, 0, r->nranks, 0);
    if (r->ef_staging != NULL)
        blocks_copy_ef(r, 0);
}

/* A request with its per-rank layout arrays allocated (not yet filled); net NULL: MPI on comm. */
static int req_new(dear_coll_op_t op, dear_dtype_t dtype, MPI_Comm comm, const dear_net_t *net,
                   const dear_mem_ops_t *mem, int tag, int rank, int nranks, double scale, dear_coll_req_t **out)
{
    int rc = DEAR_OK;
    dear_coll_req_t *r = NULL;
    DEAR_ALLOC_GOTO(r, calloc(1, sizeof *r), sizeof *r, rc, err);
    r->mem = mem ? mem : &dear_mem_host_ops;
    r->op = r->user_op = op;
    r->dtype = r->user_dtype = dtype;
    r->comm = comm;
    if (net == NULL) {
        r->mpi_net = (dear_net_t){ .tp = dear_transport_mpi(), .comm = comm, .rank = rank, .size = nranks };
        net = &r->mpi_net;
    }
    r->net = net;
    r->tag = tag;
    r->rank = rank;
    r->nranks = nranks;
    r->esize = dear_dtype_size(dtype);
    r->scale = scale;
    size_t nb = (size_t)nranks * sizeof(size_t);
    DEAR_ALLOC_GOTO(r->counts, malloc(nb), nb, rc, err);
    DEAR_ALLOC_GOTO(r->displs, malloc(nb), nb, rc, err);
    *out = r;
    return DEAR_OK;
err:
    dear_coll_free(r);
    return rc;
}

/* An all-reduce of an algorithm without one of its own (DEAR_ALGO_F_COMPOSED_AR) runs as its
 * reduce-scatter, reading the input and leaving the reduced shards in the output vector, then
 * its all-gather in place on that vector (compose_next). */
static void compose_setup(dear_coll_req_t *r, int q8)
{
    /* int8 quantizes once per phase, so its all-reduce is always the two phases in turn. */
    if (r->op != DEAR_COLL_ALLREDUCE || (!q8 && !(dear_coll_algo_flags(r->algo) & DEAR_ALGO_F_COMPOSED_AR)))
        return;
    r->composed = 1;
    r->op = DEAR_COLL_REDUCE_SCATTER;
    r->work = r->buf;
    r->out = r->buf + r->displs[r->rank] * r->esize;
}

/* A 16-bit reduction of an algorithm without DEAR_ALGO_F_EXACT16 runs on a float32 copy of the
 * input (the algorithm sees DEAR_FLOAT32, so its partial sums are never rounded) and its result
 * is rounded once into the caller's buffer by widen_finish. */
static int widen_setup(dear_coll_req_t *r)
{
    if (!dear_dtype_is16(r->dtype) || r->op == DEAR_COLL_ALLGATHER ||
        (dear_coll_algo_flags(r->algo) & DEAR_ALGO_F_EXACT16))
        return DEAR_OK;
    float *w = dear_coll_scratch_get(r->total * sizeof(float), &r->wide_cap);
    if (w == NULL)
        return DEAR_ERR_NOMEM;
    coll_widen(r, r->dtype, w, r->src, r->total);
    int rs = r->op == DEAR_COLL_REDUCE_SCATTER;
    r->wide = w;
    r->narrow_to = rs ? r->out : r->buf;
    r->narrow_from = rs ? w + r->displs[r->rank] : w;
    r->narrow_count = rs ? r->counts[r->rank] : r->total;
    r->saved_buf = r->buf;
    r->dtype = DEAR_FLOAT32;
    r->esize = sizeof(float);
    r->src = r->work = r->buf = (char *)w;
    r->out = (char *)r->narrow_from;
    r->in_place = 1;
    return DEAR_OK;
}

static void widen_finish(dear_coll_req_t *r)
{
    coll_narrow(r, r->user_dtype, r->narrow_to, r->narrow_from, r->narrow_count, 1.0);
    dear_coll_scratch_put(r->wide, r->wide_cap);
    r->wide = NULL;
    r->dtype = r->user_dtype;
    r->esize = dear_dtype_size(r->dtype);
    r->buf = r->saved_buf;
}

/* The format a phase travels in: compression applies to float32 on two or more ranks. */
static dear_compress_t wire_of(dear_dtype_t dtype, int nranks, dear_compress_t c)
{
    return dtype == DEAR_FLOAT32 && nranks > 1 ? c : DEAR_COMPRESS_NONE;
}

/* The format r's phase (r->op) travels in. */
static dear_compress_t wire_format(const dear_coll_req_t *r, dear_compress_t c)
{
    return wire_of(r->user_dtype, r->nranks, c);
}

/* Compression (coll.h): the phase about to run moves onto a 16-bit copy of the vector, made
 * here in one pass (pack), which the algorithm runs on as that type with wire16 set. A
 * reduce-scatter keeps the float32 input (src32) for the own contributions and its float32 output
 * (out32); an all-gather rounds this rank's shard into the copy; an algorithm's own all-reduce
 * gets the whole input rounded. wire_finish widens what came back (unpack). */
static int wire_setup(dear_coll_req_t *r, dear_compress_t c)
{
    if (wire_format(r, c) == DEAR_COMPRESS_NONE)
        return DEAR_OK;
    if (c == DEAR_COMPRESS_INT8) {
        r->q8 = 1;  /* coll_direct.c packs each chunk itself, from the float32 vector */
        return DEAR_OK;
    }
    dear_dtype_t wt = dear_compress_dtype(c);
    size_t es = dear_dtype_size(wt), own = r->displs[r->rank], mine = r->counts[r->rank];
    char *w = dear_coll_scratch_get(r->total * es, &r->wire_cap);
    if (w == NULL)
        return DEAR_ERR_NOMEM;
    r->wire = w;
    r->wsave.src = r->src;
    r->wsave.work = r->work;
    r->wsave.out = r->out;
    r->wsave.buf = r->buf;
    r->wsave.in_place = r->in_place;
    switch (r->op) {
    case DEAR_COLL_REDUCE_SCATTER:
        r->wire_lazy = (dear_coll_algo_flags(r->algo) & DEAR_ALGO_F_PACKS16) != 0;
        if (!r->wire_lazy)
            coll_narrow(r, wt, w, (const float *)r->src, r->total, 1.0);
        r->src32 = (const float *)r->src;
        if (dear_coll_algo_flags(r->algo) & DEAR_ALGO_F_WIRE32)
            r->out32 = (float *)r->out;
        r->src = r->work = w;
        r->out = w + own * es;
        break;
    case DEAR_COLL_ALLGATHER: {
        const char *from = r->ag_send != NULL ? r->ag_send : r->buf + own * sizeof(float);
        coll_narrow(r, wt, w + own * es, (const float *)from, mine, 1.0);
        r->ag_send = NULL;
        r->buf = w;
        break;
    }
    default:
        coll_narrow(r, wt, w, (const float *)r->src, r->total, 1.0);
        r->src32 = (const float *)r->src; /* the caller's float32 input stays as it is */
        r->src = r->buf = w;
        break;
    }
    r->in_place = 1;
    r->dtype = wt;
    r->esize = es;
    r->wire16 = 1;
    return DEAR_OK;
}

/* The phase on the 16-bit copy ended: an all-gather's or all-reduce's vector widened into the
 * caller's (every shard, this rank's too, so that all ranks hold the same bits); a
 * reduce-scatter's result, unless its algorithm wrote it in float32 itself (out32). */
static void wire_finish(dear_coll_req_t *r)
{
    r->q8 = 0;
    if (r->wire == NULL)
        return;
    if (r->op != DEAR_COLL_REDUCE_SCATTER)
        coll_widen(r, r->dtype, (float *)r->wsave.buf, r->wire, r->total);
    else if (r->out32 == NULL)
        coll_widen(r, r->dtype, (float *)r->wsave.out, r->out, r->counts[r->rank]);
    r->src = r->wsave.src;
    r->work = r->wsave.work;
    r->out = r->wsave.out;
    r->buf = r->wsave.buf;
    r->in_place = r->wsave.in_place;
    r->dtype = DEAR_FLOAT32;
    r->esize = sizeof(float);
    r->wire16 = 0;
    r->wire_lazy = 0;
    r->src32 = NULL;
    r->out32 = NULL;
    dear_coll_scratch_put(r->wire, r->wire_cap);
    r->wire = NULL;
}

/* Hand a filled request to its algorithm (at start, or at the first progress call of an
 * all-gather whose own block is copied in then). */
static int req_begin(dear_coll_req_t *r)
{
    int rc = r->ops->start(r);
    r->started = rc == DEAR_OK;
    return rc;
}

/* A transport that runs whole collectives itself (NCCL on device memory) gets them as the caller
 * gave them: no normalisation, no staging, nothing the host reads or writes (coll_native.c). */
static int native_start(const dear_coll_args_t *args, dear_coll_req_t **req)
{
    int rc = DEAR_OK;
    dear_coll_req_t *r = NULL;
    DEAR_ARG_CHECK((unsigned)args->op < DEAR_COLL_OP_COUNT && (unsigned)args->dtype < DEAR_DTYPE_COUNT,
                   "dear_coll_start: unknown op %d or dtype %d", (int)args->op, (int)args->dtype);
    DEAR_ALLOC_GOTO(r, calloc(1, sizeof *r), sizeof *r, rc, err);
    r->op = r->user_op = args->op;
    r->dtype = r->user_dtype = args->dtype;
    r->comm = args->comm;
    r->net = args->net;
    r->tag = args->tag;
    r->rank = args->net->rank;
    r->nranks = args->net->size;
    r->esize = dear_dtype_size(args->dtype);
    r->scale = args->scale;
    r->algo = DEAR_ALGO_NATIVE;
    r->ops = algo_table[DEAR_ALGO_NATIVE];
    r->native_args = *args;
    r->total = args->count;
    if (args->nblocks > 0) {
        r->total = 0;
        for (int b = 0; b < args->nblocks; b++)
            r->total += args->blocks[b].hi - args->blocks[b].lo;
    }
    DEAR_CHECK_GOTO(req_begin(r), rc, err);
    *req = r;
    return DEAR_OK;
err:
    dear_coll_free(r);
    return rc;
}

int dear_coll_queued(const dear_coll_req_t *req)
{
    return req != NULL && req->algo == DEAR_ALGO_NATIVE;
}

/* The algorithm a collective of payload bytes runs: algo, or the selection table's for auto on
 * the bytes that travel in wire (half for a 16-bit vector); an int8 phase (q8) where the choice
 * cannot quantize once per phase takes the direct exchange; an algorithm needing blocks on a
 * vector without them, the ring (DEAR_COLL_ALGO may force one). hier on a communicator it does
 * not fit is left for the caller to refuse. */
static dear_coll_algo_t pick_algo(dear_coll_op_t op, dear_coll_algo_t algo, size_t payload, dear_compress_t wire,
                                  int q8, size_t sparse_block, int nranks, const dear_coll_topo_t *topo)
{
    size_t bytes = (size_t)((double)payload * dear_compress_ratio(wire));
    dear_coll_algo_t a = algo == DEAR_ALGO_AUTO ? dear_coll_select(op, bytes, nranks, topo) : algo;
    int q8_runs = (a == DEAR_ALGO_HIER && hier_fits(topo, nranks)) || (a == DEAR_ALGO_SPARSE && sparse_block > 0);
    if (q8 && !q8_runs)
        a = DEAR_ALGO_DIRECT;
    if ((dear_coll_algo_flags(a) & DEAR_ALGO_F_NEEDS_BLOCK) && sparse_block == 0)
        a = DEAR_ALGO_RING;
    return a;
}

dear_coll_algo_t dear_coll_algo_for(dear_coll_op_t op, size_t count, dear_compress_t comp, int nranks,
                                    const dear_coll_topo_t *topo, const dear_net_t *net)
{
    if (net && net->tp->ops->coll_start) /* as dear_coll_start: the transport's own */
        return DEAR_ALGO_NATIVE;
    if ((unsigned)op >= DEAR_COLL_OP_COUNT || (unsigned)comp >= DEAR_COMPRESS_COUNT)
        return DEAR_ALGO_RING;
    dear_compress_t wire = wire_of(DEAR_FLOAT32, nranks, comp);
    return pick_algo(op, DEAR_ALGO_AUTO, count * sizeof(float), wire, wire == DEAR_COMPRESS_INT8, 0, nranks, topo);
}

int dear_coll_start(const dear_coll_args_t *args, dear_coll_req_t **req)
{
    int rank = 0, nranks = 1, rc;
    DEAR_ARG_CHECK(req != NULL, "dear_coll_start: req is NULL");
    DEAR_ARG_CHECK(args != NULL, "dear_coll_start: args is NULL");
    if (args->net && args->net->tp->ops->coll_start)
        return native_start(args, req);
    DEAR_CHECK(validate(args, &rank, &nranks));

    dear_coll_req_t *r = NULL;
    DEAR_CHECK_GOTO(req_new(args->op, args->dtype, args->comm, args->net, args->mem, args->tag, rank, nranks,
                            args->scale, &r),
                    rc, err);

    if (args->nblocks > 0) {
        DEAR_CHECK_GOTO(blocks_layout(r, args), rc, err);
        r->in_place = 1;
        if (args->op == DEAR_COLL_REDUCE_SCATTER) {
            r->src = r->work = r->buf;
            r->out = r->buf + r->displs[rank] * r->esize;
        }
    } else {
        shard_layout(r, args->count);
        r->in_place = args->sendbuf == NULL || args->sendbuf == args->recvbuf;
        size_t own = r->displs[rank] * r->esize, len = r->counts[rank] * r->esize;
        switch (args->op) {
        case DEAR_COLL_REDUCE_SCATTER:
            r->src = r->in_place ? args->recvbuf : args->sendbuf;
            r->out = r->in_place ? (char *)args->recvbuf + own : args->recvbuf;
            r->work = r->in_place ? args->recvbuf : NULL;  /* allocated by the algorithm if needed */
            break;
        case DEAR_COLL_ALLGATHER:
            /* The shard is copied into place by the first progress call, so that start stays
             * cheap for the caller and the copy overlaps whatever the caller does next. */
            r->buf = args->recvbuf;
            if (!r->in_place && len > 0)
                r->ag_send = args->sendbuf;
            r->in_place = 1;
            break;
        default:
            r->src = r->in_place ? args->recvbuf : args->sendbuf;
            r->buf = args->recvbuf;
            break;
        }
    }

    /* int8 quantizes once per phase, which the direct exchange does, hier across its hosts
     * (inside them it moves float32) and sparse (its values only): either phase int8, it runs
     * hier or sparse where that was chosen, else direct (pick_algo). */
    dear_compress_t comp = args->compress, comp_ag = args->compress_ag;
    dear_compress_t wire = wire_format(r, comp);
    dear_compress_t wire_ag = args->op == DEAR_COLL_ALLREDUCE ? wire_format(r, comp_ag) : DEAR_COMPRESS_NONE;
    int q8 = wire == DEAR_COMPRESS_INT8 || wire_ag == DEAR_COMPRESS_INT8;
    if (args->nblocks == 0 && q8)
        r->ef = args->ef;
    r->topo = args->topo;
    if (dear_coll_algo_flags(args->algo) & DEAR_ALGO_F_NATIVE) {
        DEAR_ERROR("coll", "dear_coll_start: algo native needs a transport that runs collectives itself (NCCL); "
                           "the %s transport does not (accepted here: auto or a host algorithm)",
                   dear_transport_name(r->net->tp));
        rc = DEAR_ERR_UNSUPPORTED;
        goto err;
    }
    /* The deterministic sum must not depend on which rank owns an element, but int8's blocks
     * follow the shards and the owner's input is not quantized. */
    if (q8 && dear_param_int(DEAR_P_DETERMINISTIC)) {
        DEAR_ERROR("coll", "dear_coll_start: int8 compression under DEAR_DETERMINISTIC: int8 blocks follow the shards, "
                           "so a sum would depend on its owner (accepted there: none, bf16 or fp16)");
        rc = DEAR_ERR_UNSUPPORTED;
        goto err;
    }
    r->algo = pick_algo(args->op, args->algo, r->total * r->esize, wire, q8, args->sparse_block, nranks, args->topo);
    if (r->algo == DEAR_ALGO_HIER && !hier_fits(args->topo, nranks)) {
        DEAR_ERROR("coll", "dear_coll_start: algo hier needs the topology of a communicator spanning 2..64 hosts of "
                           "2 or more ranks each, all alike (args.topo from dear_coll_topo_create); this one has %s",
                   args->topo ? "another shape" : "none");
        rc = DEAR_ERR_UNSUPPORTED;
        goto err;
    }
    r->block = args->sparse_block;
    r->ops = algo_table[r->algo];
    compose_setup(r, q8);
    r->comp_ag = comp_ag;
    DEAR_CHECK_GOTO(widen_setup(r), rc, err);
    DEAR_CHECK_GOTO(wire_setup(r, comp), rc, err);
    DEAR_DEBUG("coll", "start %s %s %s count %zu tag %d", dear_coll_op_name(r->user_op),
               dear_coll_algo_name(r->algo), dear_dtype_name(r->dtype), r->total, r->tag);
    if (r->ag_send == NULL)
        DEAR_CHECK_GOTO(req_begin(r), rc, err);
    *req = r;
    return DEAR_OK;
err:
    dear_coll_free(r);
    return rc;
}

int dear_coll_sub_start(const dear_coll_req_t *parent, dear_coll_op_t op, dear_coll_algo_t algo, const dear_net_t *net,
                        int rank, int nranks, const size_t *counts, const size_t *displs, const char *src,
                        char *vec, char *out, double scale, dear_coll_req_t **sub)
{
    return dear_coll_sub_start32(parent, op, algo, net, rank, nranks, counts, displs, src, NULL, vec, out, NULL, scale,
                                 0, sub);
}

int dear_coll_sub_start32(const dear_coll_req_t *parent, dear_coll_op_t op, dear_coll_algo_t algo,
                          const dear_net_t *net, int rank, int nranks, const size_t *counts, const size_t *displs,
                          const char *src, const float *src32, char *vec, char *out, float *out32, double scale,
                          int q8, dear_coll_req_t **sub)
{
    int rc = DEAR_OK;
    dear_coll_req_t *r = NULL;
    if (q8 && algo != DEAR_ALGO_DIRECT) {
        DEAR_ERROR("coll", "sub-collective: int8 runs on the direct exchange only, not %s", dear_coll_algo_name(algo));
        return DEAR_ERR_INTERNAL;
    }
    DEAR_CHECK_GOTO(req_new(op, parent->dtype, net->comm, net, parent->mem, parent->tag, rank, nranks, scale, &r), rc,
                    err);
    r->algo = algo;
    r->total = parent->total;
    memcpy(r->counts, counts, (size_t)nranks * sizeof(size_t));
    memcpy(r->displs, displs, (size_t)nranks * sizeof(size_t));
    r->in_place = src == vec;
    r->src = src;
    r->work = vec;
    r->buf = vec;
    r->out = out;
    r->topo = parent->topo;
    r->sub = 1;
    r->wire16 = parent->wire16;
    r->src32 = src32;
    r->out32 = out32;
    r->q8 = q8;
    r->ef = q8 ? parent->ef : NULL;
    r->ops = algo_table[algo];
    DEAR_CHECK_GOTO(req_begin(r), rc, err);
    *sub = r;
    return DEAR_OK;
err:
    dear_coll_free(r);
    return rc;
}

int dear_coll_progress(dear_coll_req_t *req, int *done)
{
    return dear_coll_progress_polled(req, NULL, done);
}

int dear_coll_progress_polled(dear_coll_req_t *req, const dear_transport_t *polled, int *done)
{
    DEAR_ARG_CHECK(req != NULL && done != NULL, "dear_coll_progress: req or done is NULL");
    DEAR_ARG_CHECK(!req->failed, "dear_coll_progress: request already failed; free it");
    if (!req->started) {
        coll_copy(req, req->buf + req->displs[req->rank] * req->esize, req->ag_send,
                  req->counts[req->rank] * req->esize);
        int rc = req_begin(req);
        if (rc != DEAR_OK) {
            req->failed = 1;
            return rc;
        }
    }
    if (!req->done) {
        if (!req->sub && req->algo != DEAR_ALGO_NATIVE && req->net->tp != polled) {
            int rc = dear_transport_progress(req->net->tp);
            if (rc != DEAR_OK) {
                req->failed = 1;
                return rc;
            }
        }
        int d = 0, rc = req->ops->progress(req, &d);
        if (rc != DEAR_OK) {
            req->failed = 1;
            return rc;
        }
        if (d && req->wide != NULL)
            widen_finish(req);
        if (d)
            wire_finish(req);
        if (d && req->composed && req->op == DEAR_COLL_REDUCE_SCATTER) {
            /* The composed all-reduce's second half (compose_setup), in its own format. */
            req->ops->cleanup(req);
            req->op = DEAR_COLL_ALLGATHER;
            rc = wire_setup(req, req->comp_ag);
            if (rc == DEAR_OK)
                rc = req_begin(req);
            if (rc != DEAR_OK) {
                req->failed = 1;
                return rc;
            }
            d = 0;
            req->events++;  /* a step taken without a transfer: a waiter must not sleep now */
        }
        if (d) {
            if (req->staging != NULL)
                blocks_unpack(req);
            req->done = 1;
        }
    }
    *done = req->done;
    return DEAR_OK;
}

int dear_coll_wait(dear_coll_req_t *req)
{
    int which;
    return dear_coll_waitany(&req, 1, &which);
}

int dear_coll_waitany(dear_coll_req_t *const *reqs, int n, int *which)
{
    return dear_coll_waitany_until(reqs, n, which, INFINITY);
}

int dear_coll_waitany_until(dear_coll_req_t *const *reqs, int n, int *which, double deadline)
{
    if (reqs == NULL || which == NULL || n < 1)
        return DEAR_ERR_ARG;
    double since = dear_now();
    size_t events = 0;
    /* One transport that can sleep for all of them, or polling. */
    dear_transport_t *tp = dear_coll_transport(reqs[0]);
    for (int i = 0; i < n; i++) {
        events += reqs[i]->events;
        if (i > 0 && dear_coll_transport(reqs[i]) != tp)
            tp = NULL;
    }
    for (;;) {
        uint64_t msgs0 = 0, msgs1 = 0;
        size_t ev = 0;
        dear_transport_counters(tp, &msgs0, NULL);
        /* One transport for all: one poll for the round (a failed poll is repeated, and fails,
         * in each request's own). */
        const dear_transport_t *polled = tp && dear_transport_progress(tp) == DEAR_OK ? tp : NULL;
        for (int i = 0; i < n; i++) {
            int done = 0;
            DEAR_CHECK(dear_coll_progress_polled(reqs[i], polled, &done));
            if (done) {
                *which = i;
                return DEAR_OK;
            }
            ev += reqs[i]->events;
        }
        if (isfinite(deadline) && dear_now() >= deadline)
            return DEAR_ERR_TIMEOUT;
        if (tp) {
            /* Sleep until the transport has something, unless this round moved a message (then
             * the algorithm may have more to post). The timeout only bounds a missed case. */
            dear_transport_counters(tp, &msgs1, NULL);
            if (msgs1 == msgs0 && ev == events)
                DEAR_CHECK(dear_transport_block(tp, 0.1));
            events = ev;
            continue;
        }
        /* Back off without spinning (ranks may outnumber cores): poll for 20 us after the last
         * completed transfer (replies often come that fast), yield until 100 ms have passed
         * without one (large messages need our MPI calls to move at all), then sleep in short
         * steps (docs/PERFORMANCE.md#coll-wait). */
        if (ev != events) {
            events = ev;
            since = dear_now();
        }
        double idle = dear_now() - since;
        if (idle < 20e-6)
            continue;  /* a reply within a few microseconds is common: poll before yielding */
        if (idle < 100e-3)
            sched_yield();
        else
            dear_sleep(20e-6);
    }
}

dear_transport_t *dear_coll_transport(const dear_coll_req_t *req)
{
    dear_transport_t *tp = req->net->tp;
    if (!dear_transport_can_block(tp) || req->algo == DEAR_ALGO_MPI)
        return NULL;
    if (req->algo == DEAR_ALGO_HIER)
        for (int i = 0; i < 2; i++)
            if (req->topo->node_net[i]->tp != tp || req->topo->cross_net[i]->tp != tp)
                return NULL;
    return tp;
}

void dear_coll_get_info(const dear_coll_req_t *req, dear_coll_info_t *info)
{
    if (req == NULL || info == NULL)
        return;
    info->op = req->user_op;
    info->algo = req->algo;
    info->bytes = req->total * dear_dtype_size(req->user_dtype);
    info->bytes_sent = req->bytes_sent;
    info->events = req->events;
    info->msgs_sparse = req->msgs_sparse;
    info->msgs_dense = req->msgs_dense;
}

void dear_coll_each_req(dear_coll_req_t *req, dear_net_req_fn_t fn, void *arg)
{
    if (req != NULL && req->ops != NULL && req->ops->each_req != NULL && req->state != NULL)
        req->ops->each_req(req, fn, arg);
}

void dear_coll_free(dear_coll_req_t *req)
{
    if (req == NULL)
        return;
    if (req->ops != NULL && req->ops->cleanup != NULL)
        req->ops->cleanup(req);
    dear_coll_scratch_put(req->scratch, req->scratch_bytes);
    dear_coll_scratch_put(req->wide, req->wide_cap);
    dear_coll_scratch_put(req->wire, req->wire_cap);
    free(req->staging);
    free(req->ef_staging);
    free(req->blocks);
    free(req->counts);
    free(req->displs);
    free(req);
}

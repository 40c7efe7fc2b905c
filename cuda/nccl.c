/*
 * NCCL, a collective engine: a transport (net.h) that carries no point-to-point messages but runs
 * whole collectives itself on device memory (coll_start), chosen by DEAR_CUDA_TRANSPORT and not
 * listed in DEAR_TRANSPORT_TABLE, whose rows carry dear's own algorithms; on the communication
 * stream that the CUDA memory row also packs and unpacks on, so stream order alone puts a
 * bucket's packing before its reduce-scatter and its unpacking after its all-gather.
 *
 * One communicator per context, bootstrapped over its MPI communicator (rank 0's unique id,
 * broadcast), non-blocking so that a set-up that hangs ends at DEAR_CUDA_INIT_TIMEOUT_S.
 * The shard rule (collectives/coll.h) allows counts that P does not divide: those, and the pieces
 * of multi-block collectives, run as one NCCL group of a reduce (broadcast) per owner, the
 * others as ncclReduceScatter / ncclAllGather in place. Averaging is ncclAvg.
 * Compressed float32 (coll.h, args.compress): the vector is rounded into a 16-bit copy in device
 * scratch by a kernel on the stream, NCCL runs the collective in that type (its own partial sums
 * in 16 bits, hop by hop, the average rounded too) and a kernel widens what came back, all in
 * stream order. int8 cannot be summed by NCCL, so it runs the host's direct shape
 * (collectives/coll_direct.c) with NCCL moving bytes only: kernels pack each rank's chunk for
 * each owner once, one ncclAlltoAll carries them, the owner adds them to its own float32 chunk;
 * the owner packs its averaged chunk once and ncclAllGather carries it to every rank, itself
 * included, so all ranks hold the same values. An all-reduce is its two phases.
 */
#include "config.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "base/mpi_check.h"
#include "base/util.h"
#include "collectives/coll.h"
#include "collectives/reduce.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_impl.h"
#include "cuda/kern.h"

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int rank, size;
    int broken;                 /* an asynchronous error was seen: abort, do not destroy */
    char *wire;                 /* compression's 16-bit copies and int8 chunks (device scratch, used in
                                 * stream order) */
    size_t wire_cap;
    char *stage;                /* int8 multi-block collectives: the pieces in rank order, float32, and
                                 * their residuals (device scratch) */
    size_t stage_cap;
} nccl_t;

typedef struct {
    nccl_t *n;
    cudaEvent_t done;
} handle_t;

static int nccl_type(dear_dtype_t t, ncclDataType_t *out)
{
    switch (t) {
    case DEAR_FLOAT32: *out = ncclFloat32; return DEAR_OK;
    case DEAR_FLOAT64: *out = ncclFloat64; return DEAR_OK;
    case DEAR_BFLOAT16: *out = ncclBfloat16; return DEAR_OK;
    case DEAR_FLOAT16: *out = ncclFloat16; return DEAR_OK;
    case DEAR_INT32: *out = ncclInt32; return DEAR_OK;
    }
    DEAR_ERROR("nccl", "element type %d has no NCCL type", (int)t);
    return DEAR_ERR_ARG;
}

/* Sum, or the average over the ranks (the only scales the runtime asks for). */
static int nccl_op(const nccl_t *n, double scale, ncclRedOp_t *op)
{
    if (scale == 1.0) {
        *op = ncclSum;
        return DEAR_OK;
    }
    if (fabs(scale * n->size - 1.0) < 1e-12) {
        *op = ncclAvg;
        return DEAR_OK;
    }
    DEAR_ERROR("nccl", "a reduction scaled by %g: NCCL runs sums and averages over the %d ranks only", scale, n->size);
    return DEAR_ERR_UNSUPPORTED;
}

/* In a non-blocking communicator a call may leave its work still being enqueued: wait for that
 * (not for the GPU), and surface an error of the communicator. */
static int settle(nccl_t *n)
{
    for (;;) {
        ncclResult_t st = ncclSuccess;
        DEAR_NCCL_CHECK(ncclCommGetAsyncError(n->comm, &st));
        if (st == ncclSuccess)
            return DEAR_OK;
        if (st != ncclInProgress) {
            n->broken = 1;
            DEAR_ERROR("nccl", "the NCCL communicator failed: %s (%s)", ncclGetErrorString(st), ncclGetLastError(n->comm));
            return DEAR_ERR_CUDA;
        }
        sched_yield();
    }
}

/* One owner's share at p: reduced onto it (reduce-scatter) or sent from it to all (all-gather). */
static int owner_step(nccl_t *n, dear_coll_op_t op, char *p, size_t cnt, int root, ncclDataType_t type,
                      ncclRedOp_t redop)
{
    if (cnt == 0)
        return DEAR_OK;
    if (op == DEAR_COLL_REDUCE_SCATTER)
        DEAR_NCCL_CHECK(ncclReduce(p, p, cnt, type, redop, root, n->comm, n->stream));
    else
        DEAR_NCCL_CHECK(ncclBroadcast(p, p, cnt, type, root, n->comm, n->stream));
    return DEAR_OK;
}

/* The collective's calls, inside a group. */
static int enqueue(nccl_t *n, const dear_coll_args_t *a, ncclDataType_t type, ncclRedOp_t redop)
{
    size_t es = dear_dtype_size(a->dtype);
    if (a->nblocks > 0) {
        for (int b = 0; b < a->nblocks; b++)
            for (int r = 0; r < n->size; r++) {
                size_t at, cnt = dear_coll_block_piece(&a->blocks[b], n->size, r, &at);
                DEAR_CHECK(owner_step(n, a->op, (char *)a->blocks[b].buf + at * es, cnt, r, type, redop));
            }
        return DEAR_OK;
    }
    char *recv = a->recvbuf;
    const char *send = a->sendbuf && a->sendbuf != a->recvbuf ? a->sendbuf : NULL;
    size_t off, len, share = a->count / (size_t)n->size;
    dear_coll_shard(a->count, n->size, n->rank, &off, &len);
    int even = a->count % (size_t)n->size == 0;
    switch (a->op) {
    case DEAR_COLL_ALLREDUCE:
        DEAR_NCCL_CHECK(ncclAllReduce(send ? send : recv, recv, a->count, type, redop, n->comm, n->stream));
        return DEAR_OK;
    case DEAR_COLL_REDUCE_SCATTER:
        if (even) {
            DEAR_NCCL_CHECK(ncclReduceScatter(send ? send : recv, send ? recv : recv + off * es, share, type, redop,
                                              n->comm, n->stream));
            return DEAR_OK;
        }
        if (send) { /* out of place: every owner's shard reduced from send, this rank's into recv */
            for (int r = 0; r < n->size; r++) {
                size_t o, l;
                dear_coll_shard(a->count, n->size, r, &o, &l);
                if (l > 0)
                    DEAR_NCCL_CHECK(ncclReduce(send + o * es, r == n->rank ? (void *)recv : (void *)(send + o * es), l,
                                               type, redop, r, n->comm, n->stream));
            }
            return DEAR_OK;
        }
        break;
    case DEAR_COLL_ALLGATHER:
        if (even) {
            DEAR_NCCL_CHECK(ncclAllGather(send ? send : recv + off * es, recv, share, type, n->comm, n->stream));
            return DEAR_OK;
        }
        if (send && len > 0) /* out of place: this rank's shard into place first, in stream order */
            DEAR_CUDA_CHECK(cudaMemcpyAsync(recv + off * es, send, len * es, cudaMemcpyDeviceToDevice, n->stream));
        break;
    default: return DEAR_ERR_ARG;
    }
    for (int r = 0; r < n->size; r++) {
        size_t at, cnt;
        dear_coll_shard(a->count, n->size, r, &at, &cnt);
        DEAR_CHECK(owner_step(n, a->op, recv + at * es, cnt, r, type, redop));
    }
    return DEAR_OK;
}

/* The collective's calls in one NCCL group, enqueued (settled) on the stream. */
static int run_group(nccl_t *n, const dear_coll_args_t *a, ncclDataType_t type, ncclRedOp_t redop)
{
    if (ncclGroupStart() != ncclSuccess)
        return DEAR_ERR_CUDA;
    int rc = enqueue(n, a, type, redop);
    ncclResult_t end = ncclGroupEnd();
    if (rc == DEAR_OK && end != ncclSuccess && end != ncclInProgress) {
        DEAR_ERROR("nccl", "ncclGroupEnd failed: %s (%s)", ncclGetErrorString(end), ncclGetLastError(n->comm));
        rc = DEAR_ERR_CUDA;
    }
    return rc == DEAR_OK ? settle(n) : rc;
}

/* ---- compression ---- */

/* Room for bytes of device scratch in *buf. Work enqueued earlier may still read the old buffer,
 * so the stream is waited for before it goes: only when a larger collective than any before comes. */
static int room(nccl_t *n, char **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return DEAR_OK;
    if (*buf != NULL) {
        DEAR_CUDA_CHECK(cudaStreamSynchronize(n->stream));
        cudaFree(*buf);
        *buf = NULL;
        *cap = 0;
    }
    DEAR_CUDA_CHECK(cudaMalloc((void **)buf, bytes));
    *cap = bytes;
    return DEAR_OK;
}

static int wire_room(nccl_t *n, size_t bytes) { return room(n, &n->wire, &n->wire_cap, bytes); }

static int kern(cudaError_t e, const char *what)
{
    if (e == cudaSuccess)
        return DEAR_OK;
    DEAR_ERROR("nccl", "the %s kernel of a compressed collective failed: %s", what, cudaGetErrorString(e));
    return DEAR_ERR_CUDA;
}

/* Block b's range [lo, hi) lies at element off[b] of the 16-bit copy. Round into the copy what
 * the collective reads (to_wire: all of each range for a reduce-scatter, this rank's pieces for
 * an all-gather), or widen back what it wrote (this rank's pieces, every range). */
static int wire_blocks(nccl_t *n, const dear_coll_args_t *a, dear_dtype_t wt, const size_t *off, int to_wire)
{
    int rs = a->op == DEAR_COLL_REDUCE_SCATTER;
    for (int b = 0; b < a->nblocks; b++) {
        const dear_coll_block_t *bl = &a->blocks[b];
        size_t at = bl->lo, cnt = bl->hi - bl->lo;
        if (to_wire != rs)
            cnt = dear_coll_block_piece(bl, n->size, n->rank, &at);
        if (cnt == 0)
            continue;
        float *f = (float *)bl->buf + at;
        char *w = n->wire + (off[b] + at - bl->lo) * 2;
        DEAR_CHECK(to_wire ? kern(dear_kern_narrow(n->stream, wt, w, f, cnt, 1.0), "round")
                           : kern(dear_kern_widen(n->stream, wt, f, w, cnt), "widen"));
    }
    return DEAR_OK;
}

/* The collective of a on its 16-bit copy: rounded in, NCCL's collective in the 16-bit type, widened
 * out (a reduce-scatter's own shard, an all-gather's or all-reduce's whole vector). */
static int wire_enqueue(nccl_t *n, const dear_coll_args_t *a, dear_dtype_t wt, ncclRedOp_t redop)
{
    ncclDataType_t type;
    DEAR_CHECK(nccl_type(wt, &type));
    size_t total = a->count;
    size_t *off = NULL;
    if (a->nblocks > 0) {
        off = malloc(sizeof *off * (size_t)a->nblocks);
        if (off == NULL)
            return DEAR_ERR_NOMEM;
        total = 0;
        for (int b = 0; b < a->nblocks; b++) {
            off[b] = total;
            total += a->blocks[b].hi - a->blocks[b].lo;
        }
    }
    int rc = wire_room(n, total * 2 + 1);
    if (rc == DEAR_OK && a->nblocks > 0) {
        rc = wire_blocks(n, a, wt, off, 1);
        if (rc == DEAR_OK)
            rc = ncclGroupStart() == ncclSuccess ? DEAR_OK : DEAR_ERR_CUDA;
        if (rc == DEAR_OK) {
            for (int b = 0; b < a->nblocks && rc == DEAR_OK; b++)
                for (int r = 0; r < n->size && rc == DEAR_OK; r++) {
                    const dear_coll_block_t *bl = &a->blocks[b];
                    size_t at, cnt = dear_coll_block_piece(bl, n->size, r, &at);
                    rc = owner_step(n, a->op, n->wire + (off[b] + at - bl->lo) * 2, cnt, r, type, redop);
                }
            ncclResult_t end = ncclGroupEnd();
            if (rc == DEAR_OK && end != ncclSuccess && end != ncclInProgress)
                rc = DEAR_ERR_CUDA;
        }
        if (rc == DEAR_OK)
            rc = settle(n);
        if (rc == DEAR_OK)
            rc = wire_blocks(n, a, wt, off, 0);
        free(off);
        return rc;
    }
    free(off);
    if (rc != DEAR_OK)
        return rc;
    size_t o, len;
    dear_coll_shard(a->count, n->size, n->rank, &o, &len);
    const float *send = a->sendbuf && a->sendbuf != a->recvbuf ? a->sendbuf : NULL;
    float *recv = a->recvbuf;
    int ag = a->op == DEAR_COLL_ALLGATHER, rs = a->op == DEAR_COLL_REDUCE_SCATTER;
    /* In: an all-gather's own shard, else the whole input. */
    const float *in = ag ? (send ? send : recv + o) : (send ? send : recv);
    DEAR_CHECK(kern(dear_kern_narrow(n->stream, wt, n->wire + (ag ? o * 2 : 0), in, ag ? len : a->count, 1.0),
                    "round"));
    dear_coll_args_t w = *a;
    w.dtype = wt;
    w.sendbuf = NULL;
    w.recvbuf = n->wire;
    DEAR_CHECK(run_group(n, &w, type, redop));
    /* Out: a reduce-scatter's own shard (into recv when out of place), else the whole vector. */
    float *out = rs ? (send ? recv : recv + o) : recv;
    return kern(dear_kern_widen(n->stream, wt, out, n->wire + (rs ? o * 2 : 0), rs ? len : a->count), "widen");
}

/* ---- int8 ---- */

/* ncclAlltoAll came with NCCL 2.28: weak, so that libdear still loads with an older libnccl, and
 * int8 is refused at commit there (dear_nccl_alltoall). */
#pragma weak ncclAlltoAll

int dear_nccl_alltoall(void) { return ncclAlltoAll != NULL; }

/* An int8 phase over a float32 vector v cut into the ranks' chunks: rank p's at v + at[p], len[p]
 * long, its residuals at e + at[p] (e NULL: none); slot bytes per packed chunk, the same on every
 * rank, so that NCCL moves equal counts. */
typedef struct {
    float *v, *e;
    size_t *at, *len;
    size_t slot;
} q8_t;

/* NCCL moving packed chunks: one all-to-all (chunk p of send to rank p, rank p's into chunk p of
 * recv) or, recv NULL, this rank's chunk p of send gathered into every rank's send. */
static int q8_move(nccl_t *n, char *send, char *recv, size_t slot)
{
    if (ncclGroupStart() != ncclSuccess)
        return DEAR_ERR_CUDA;
    ncclResult_t r = recv != NULL ? ncclAlltoAll(send, recv, slot, ncclInt8, n->comm, n->stream)
                                  : ncclAllGather(send + (size_t)n->rank * slot, send, slot, ncclInt8, n->comm, n->stream);
    ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess || (end != ncclSuccess && end != ncclInProgress)) {
        DEAR_ERROR("nccl", "%s of int8 chunks failed: %s (%s)", recv != NULL ? "ncclAlltoAll" : "ncclAllGather",
                   ncclGetErrorString(r != ncclSuccess ? r : end), ncclGetLastError(n->comm));
        return DEAR_ERR_CUDA;
    }
    return settle(n);
}

/* Reduce-scatter: this rank's chunk for every other rank packed with its residuals, the chunks
 * exchanged, and out = (this rank's own float32 chunk + the P - 1 received, in the host's order) *
 * scale. */
static int q8_rs(nccl_t *n, const q8_t *q, float *out, double scale)
{
    int P = n->size, me = n->rank;
    DEAR_CHECK(wire_room(n, 2 * (size_t)P * q->slot + 1));
    char *send = n->wire, *recv = n->wire + (size_t)P * q->slot;
    for (int p = 0; p < P; p++)
        if (p != me)
            DEAR_CHECK(kern(dear_kern_q8_pack(n->stream, send + (size_t)p * q->slot, q->v + q->at[p],
                                              q->e != NULL ? q->e + q->at[p] : NULL, q->len[p]),
                            "int8 pack"));
    DEAR_CHECK(q8_move(n, send, recv, q->slot));
    size_t mine = q->len[me];
    if (out != q->v + q->at[me] && mine > 0)
        DEAR_CUDA_CHECK(cudaMemcpyAsync(out, q->v + q->at[me], mine * sizeof(float), cudaMemcpyDeviceToDevice,
                                        n->stream));
    for (int i = 1; i < P; i++)
        DEAR_CHECK(kern(dear_kern_q8_unpack(n->stream, out, recv + (size_t)((me + i) % P) * q->slot, mine, 1),
                        "int8 unpack"));
    return scale == 1.0 ? DEAR_OK : kern(dear_kern_scale(n->stream, DEAR_FLOAT32, out, out, mine, scale), "scale");
}

/* All-gather: this rank's chunk packed once with its residuals, gathered, and every chunk, this
 * rank's too, the values of those bytes. */
static int q8_ag(nccl_t *n, const q8_t *q)
{
    int P = n->size, me = n->rank;
    DEAR_CHECK(wire_room(n, (size_t)P * q->slot + 1));
    DEAR_CHECK(kern(dear_kern_q8_pack(n->stream, n->wire + (size_t)me * q->slot, q->v + q->at[me],
                                      q->e != NULL ? q->e + q->at[me] : NULL, q->len[me]),
                    "int8 pack"));
    DEAR_CHECK(q8_move(n, n->wire, NULL, q->slot));
    for (int p = 0; p < P; p++)
        DEAR_CHECK(kern(dear_kern_q8_unpack(n->stream, q->v + q->at[p], n->wire + (size_t)p * q->slot, q->len[p], 0),
                        "int8 unpack"));
    return DEAR_OK;
}

typedef struct {
    nccl_t *n;
    float *stage;
    int to, ef;
} move_arg_t;

static int move_piece(void *arg, const dear_coll_block_t *b, size_t at, size_t cnt, size_t pos)
{
    const move_arg_t *m = arg;
    float *st = m->stage + pos, *blk = (m->ef ? b->ef : (float *)b->buf) + at;
    DEAR_CUDA_CHECK(cudaMemcpyAsync(m->to ? st : blk, m->to ? blk : st, cnt * sizeof(float), cudaMemcpyDeviceToDevice,
                                    m->n->stream));
    return DEAR_OK;
}

/* Ranks [p0, p1)'s pieces of a multi-block collective, block after block, copied between the
 * blocks (their vectors, or with ef their residuals) and the staging vector at at[p] (to: into it). */
static int blocks_move(nccl_t *n, const dear_coll_args_t *a, float *stage, const size_t *at, int p0, int p1, int to,
                       int ef)
{
    move_arg_t m = { n, stage, to, ef };
    return dear_coll_blocks_each(a->blocks, a->nblocks, n->size, at, p0, p1, move_piece, &m);
}

/* What a multi-block phase reads into the staging vector (to) or writes back from it: a
 * reduce-scatter reads every rank's pieces and writes back its own, an all-gather the reverse;
 * the residuals are the other ranks' pieces' in a reduce-scatter and its own in an all-gather,
 * so that a phase never writes back residuals another phase owns. */
static int blocks_stage(nccl_t *n, const dear_coll_args_t *a, const q8_t *q, int to)
{
    int P = n->size, me = n->rank, rs = a->op == DEAR_COLL_REDUCE_SCATTER;
    if (rs == to)
        DEAR_CHECK(blocks_move(n, a, q->v, q->at, 0, P, to, 0));
    else
        DEAR_CHECK(blocks_move(n, a, q->v, q->at, me, me + 1, to, 0));
    if (q->e == NULL)
        return DEAR_OK;
    if (!rs)
        return blocks_move(n, a, q->e, q->at, me, me + 1, to, 1);
    DEAR_CHECK(blocks_move(n, a, q->e, q->at, 0, me, to, 1));
    return blocks_move(n, a, q->e, q->at, me + 1, P, to, 1);
}

/* One int8 phase (a reduce-scatter or an all-gather) of a: the ranks' chunks are the shard rule's
 * of the vector, or of a multi-block collective its pieces in rank order (one block in place,
 * several through the staging vector). */
static int q8_phase(nccl_t *n, const dear_coll_args_t *a)
{
    int P = n->size, me = n->rank, rs = a->op == DEAR_COLL_REDUCE_SCATTER, rc = DEAR_OK;
    size_t *at = malloc(2 * (size_t)P * sizeof *at), total = 0, most = 0;
    if (at == NULL)
        return DEAR_ERR_NOMEM;
    q8_t q = { .at = at, .len = at + P };
    for (int p = 0; p < P; p++) {
        if (a->nblocks == 0) {
            dear_coll_shard(a->count, P, p, &q.at[p], &q.len[p]);
        } else {
            q.at[p] = total;
            q.len[p] = dear_coll_blocks_count(a->blocks, a->nblocks, P, p);
            total += q.len[p];
        }
        most = q.len[p] > most ? q.len[p] : most;
    }
    q.slot = dear_q8_stride(most);
    float *recv = a->recvbuf, *out;
    const float *send = a->sendbuf && a->sendbuf != a->recvbuf ? a->sendbuf : NULL;
    if (a->nblocks == 0) {
        q.v = rs && send ? (float *)send : recv;
        q.e = a->ef;
        out = rs && send ? recv : recv + q.at[me];
        if (!rs && send && q.len[me] > 0)
            DEAR_CUDA_CHECK_GOTO(cudaMemcpyAsync(recv + q.at[me], send, q.len[me] * sizeof(float),
                                                 cudaMemcpyDeviceToDevice, n->stream),
                                 rc, out);
    } else if (a->nblocks == 1) {
        const dear_coll_block_t *bl = &a->blocks[0];
        q.v = (float *)bl->buf + bl->lo;
        q.e = bl->ef != NULL ? bl->ef + bl->lo : NULL;
        out = q.v + q.at[me];
    } else {
        int ef = a->blocks[0].ef != NULL;
        rc = room(n, &n->stage, &n->stage_cap, (ef ? 2 : 1) * total * sizeof(float) + 1);
        q.v = (float *)n->stage;
        q.e = ef ? q.v + total : NULL;
        out = q.v + q.at[me];
        if (rc == DEAR_OK)
            rc = blocks_stage(n, a, &q, 1);
    }
    if (rc == DEAR_OK)
        rc = rs ? q8_rs(n, &q, out, a->scale) : q8_ag(n, &q);
    if (rc == DEAR_OK && a->nblocks > 1)
        rc = blocks_stage(n, a, &q, 0);
out:
    free(at);
    return rc;
}

/* A phase of a compressed collective in its format: int8 here, 16 bits through the wire copy,
 * none as NCCL's own. */
static int phase(nccl_t *n, const dear_coll_args_t *a, ncclRedOp_t redop)
{
    if (a->compress == DEAR_COMPRESS_INT8)
        return q8_phase(n, a);
    if (a->compress != DEAR_COMPRESS_NONE)
        return wire_enqueue(n, a, dear_compress_dtype(a->compress), redop);
    return run_group(n, a, ncclFloat32, redop);
}

/* A float32 collective with an int8 phase: an all-reduce runs as its reduce-scatter, in place on
 * recvbuf, then its all-gather, each in its own format. */
static int q8_enqueue(nccl_t *n, const dear_coll_args_t *a, ncclRedOp_t redop)
{
    if (a->op != DEAR_COLL_ALLREDUCE)
        return phase(n, a, redop);
    if (a->sendbuf != NULL && a->sendbuf != a->recvbuf && a->count > 0)
        DEAR_CUDA_CHECK(cudaMemcpyAsync(a->recvbuf, a->sendbuf, a->count * sizeof(float), cudaMemcpyDeviceToDevice,
                                        n->stream));
    dear_coll_args_t h = *a;
    h.sendbuf = NULL;
    h.op = DEAR_COLL_REDUCE_SCATTER;
    DEAR_CHECK(phase(n, &h, redop));
    h.op = DEAR_COLL_ALLGATHER;
    h.compress = a->compress_ag;
    h.scale = 1.0;
    return phase(n, &h, ncclSum);
}

static int nccl_coll_start(const dear_net_t *ep, const dear_coll_args_t *a, void **handle)
{
    nccl_t *n = ep->tp->impl;
    ncclDataType_t type;
    ncclRedOp_t redop = ncclSum;
    int q8 = a->dtype == DEAR_FLOAT32 && n->size > 1 &&
             (a->compress == DEAR_COMPRESS_INT8 || (a->op == DEAR_COLL_ALLREDUCE && a->compress_ag == DEAR_COMPRESS_INT8));
    if (q8 && !dear_nccl_alltoall()) {
        DEAR_ERROR("nccl", "int8 compression on the NCCL transport needs ncclAlltoAll (NCCL 2.28 or newer); this "
                           "libnccl has none (accepted here: none, bf16 or fp16; int8 with DEAR_CUDA_TRANSPORT=staged)");
        return DEAR_ERR_UNSUPPORTED;
    }
    DEAR_CHECK(nccl_type(a->dtype, &type));
    if (a->op != DEAR_COLL_ALLGATHER)
        DEAR_CHECK(nccl_op(n, a->scale, &redop));
    handle_t *h = calloc(1, sizeof *h);
    if (h == NULL)
        return DEAR_ERR_NOMEM;
    h->n = n;
    int rc = DEAR_OK;
    DEAR_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&h->done, cudaEventDisableTiming), rc, err);
    /* Compressed: an all-reduce runs in its reduce-scatter half's format, as the host's own
     * all-reduces do. */
    if (q8)
        rc = q8_enqueue(n, a, redop);
    else if (a->dtype == DEAR_FLOAT32 && a->compress != DEAR_COMPRESS_NONE && n->size > 1)
        rc = wire_enqueue(n, a, dear_compress_dtype(a->compress), redop);
    else
        rc = run_group(n, a, type, redop);
    if (rc != DEAR_OK)
        goto err_ev;
    DEAR_CUDA_CHECK_GOTO(cudaEventRecord(h->done, n->stream), rc, err_ev);
    *handle = h;
    return DEAR_OK;
err_ev:
    cudaEventDestroy(h->done);
err:
    free(h);
    return rc;
}

static int nccl_coll_test(void *handle, int *done)
{
    handle_t *h = handle;
    cudaError_t err = cudaEventQuery(h->done);
    *done = err == cudaSuccess;
    if (err == cudaSuccess)
        return DEAR_OK;
    if (err != cudaErrorNotReady) {
        DEAR_ERROR("cuda", "waiting for an NCCL collective: %s", cudaGetErrorString(err));
        return DEAR_ERR_CUDA;
    }
    /* Still running: a peer's failure shows as the communicator's error, never as a hang. */
    ncclResult_t st = ncclSuccess;
    DEAR_NCCL_CHECK(ncclCommGetAsyncError(h->n->comm, &st));
    if (st != ncclSuccess && st != ncclInProgress) {
        h->n->broken = 1;
        DEAR_ERROR("nccl", "an NCCL collective failed: %s (%s)", ncclGetErrorString(st), ncclGetLastError(h->n->comm));
        return DEAR_ERR_CUDA;
    }
    return DEAR_OK;
}

static void nccl_coll_release(void *handle)
{
    handle_t *h = handle;
    cudaEventDestroy(h->done);
    free(h);
}

static void nccl_destroy(dear_transport_t *tp)
{
    nccl_t *n = tp->impl;
    if (n->broken)
        ncclCommAbort(n->comm); /* a failed communicator may never finish its work */
    else
        ncclCommDestroy(n->comm);
    if (!n->broken) { /* a broken communicator's work may never end: its scratch is left */
        if (n->wire != NULL)
            cudaFree(n->wire);
        if (n->stage != NULL)
            cudaFree(n->stage);
    }
    free(n);
    free(tp);
}

const dear_transport_ops_t dear_nccl_ops = {
    .name = "nccl",
    .destroy = nccl_destroy,
    .coll_start = nccl_coll_start,
    .coll_test = nccl_coll_test,
    .coll_release = nccl_coll_release,
};

/* Non-blocking init, polled until done or the deadline: a hung set-up is aborted and reported. */
static int init_comm(nccl_t *n, ncclUniqueId id, double timeout_s)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, n->size, id, n->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        DEAR_ERROR("nccl", "ncclCommInitRankConfig (rank %d of %d) failed: %s (%s)", n->rank, n->size,
                   ncclGetErrorString(r), ncclGetLastError(NULL));
        return DEAR_ERR_CUDA;
    }
    double t0 = dear_now();
    for (;;) {
        ncclResult_t st = ncclSuccess;
        r = ncclCommGetAsyncError(n->comm, &st);
        if (r == ncclSuccess && st == ncclSuccess)
            return DEAR_OK;
        if (r != ncclSuccess || st != ncclInProgress) {
            DEAR_ERROR("nccl", "the NCCL communicator's set-up (rank %d of %d) failed: %s (%s)", n->rank, n->size,
                       ncclGetErrorString(r != ncclSuccess ? r : st), ncclGetLastError(n->comm));
            ncclCommAbort(n->comm);
            return DEAR_ERR_CUDA;
        }
        if (dear_now() - t0 > timeout_s) {
            DEAR_ERROR("nccl", "the NCCL communicator's set-up (rank %d of %d) took more than "
                               "DEAR_CUDA_INIT_TIMEOUT_S=%g s: aborted",
                       n->rank, n->size, timeout_s);
            ncclCommAbort(n->comm);
            return DEAR_ERR_TIMEOUT;
        }
        dear_sleep(1e-3);
    }
}

int dear_nccl_create(MPI_Comm comm, cudaStream_t stream, double timeout_s, dear_transport_t **out)
{
    int rc = DEAR_OK, rank = 0, size = 1, rc0, worst = 0;
    ncclUniqueId id = { { 0 } };
    DEAR_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    DEAR_MPI_CHECK(MPI_Comm_size(comm, &size));
    nccl_t *n = calloc(1, sizeof *n);
    dear_transport_t *tp = calloc(1, sizeof *tp);
    if (n == NULL || tp == NULL) {
        DEAR_ERROR("sys", "allocation of the NCCL transport failed");
        rc = DEAR_ERR_NOMEM;
    } else {
        *n = (nccl_t){ .stream = stream, .rank = rank, .size = size };
    }
    if (rc == DEAR_OK && rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
        DEAR_ERROR("nccl", "ncclGetUniqueId failed: %s", ncclGetLastError(NULL));
        rc = DEAR_ERR_CUDA;
    }
    /* Rank 0's verdict travels with its id: nobody starts a set-up rank 0 cannot join. */
    rc0 = rc;
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&rc0, 1, MPI_INT, 0, comm), rc, out);
    DEAR_MPI_CHECK_GOTO(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm), rc, out);
    int joined = 0;
    if (rc == DEAR_OK && rc0 == DEAR_OK) {
        rc = init_comm(n, id, timeout_s);
        joined = rc == DEAR_OK;
    } else if (rc == DEAR_OK) {
        rc = rc0;
    }
    DEAR_MPI_CHECK_GOTO(MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, comm), rc, out);
    if (worst != DEAR_OK) {
        if (joined) {
            DEAR_ERROR("nccl", "another rank could not set up the NCCL communicator (its log says why)");
            ncclCommAbort(n->comm);
        }
        rc = worst;
        goto out;
    }
    tp->ops = &dear_nccl_ops;
    tp->impl = n;
    tp->base = comm;
    *out = tp;
    return DEAR_OK;
out:
    free(n);
    free(tp);
    return rc;
}

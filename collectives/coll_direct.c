/*
 * Algorithm `direct`: every rank exchanges with every other rank at once, one round per phase.
 * The reduce-scatter sends chunk p of the input straight to rank p and receives the P-1 pieces
 * of its own chunk, then adds them in rank order (deterministic, with the scale fused into the
 * last addition); the all-gather sends this rank's shard to all others and receives theirs in
 * place; the all-reduce is the one followed by the other. Each rank sends and receives
 * (P-1)/P of the vector per phase, as the ring does, but with one latency per phase instead of
 * P-1, which is what counts for small vectors: on the emulated TCP cluster the ring's three
 * dependent steps at P = 4 cost more than the transfer itself up to a few hundred KiB, and
 * Open MPI's non-blocking all-gather (a linear exchange) beat it for that reason. It does not
 * pipeline the reduction with the transfers and posts 2(P-1) messages at once, so it is for
 * small vectors only (see the selection table in coll.c).
 */
#include <limits.h>
#include <stdlib.h>

#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "runtime/check.h"
#include "runtime/log.h"

typedef struct {
    int phase, nphases;
    dear_coll_op_t ops[2];
    int nreq;                   /* requests of the current phase, all posted at phase start */
    int ndone;
    MPI_Request *reqs;          /* 2 (P-1): receives first, then sends */
    char *slots;                /* reduce-scatter: P-1 pieces of this rank's chunk */
} direct_state_t;

static char *elem(const dear_coll_req_t *r, const void *base, size_t index)
{
    return (char *)base + index * r->esize;
}

/* Post the whole phase: P-1 receives and P-1 sends. */
static int phase_post(dear_coll_req_t *r, direct_state_t *st)
{
    int P = r->nranks, me = r->rank, n = 0;
    size_t mine = r->counts[me];
    int rs = st->ops[st->phase] == DEAR_COLL_REDUCE_SCATTER;
    for (int i = 1; i < P; i++) {
        int p = (me + i) % P;   /* partners in a rotated order, so no rank is everyone's first */
        void *dst = rs ? st->slots + (size_t)(i - 1) * mine * r->esize : elem(r, r->buf, r->displs[p]);
        size_t len = rs ? mine : r->counts[p];
        DEAR_MPI_CHECK(MPI_Irecv(dst, (int)(len * r->esize), MPI_BYTE, p, r->tag, r->comm, &st->reqs[n++]));
    }
    for (int i = 1; i < P; i++) {
        int p = (me - i + P) % P;
        const void *src = rs ? elem(r, r->src, r->displs[p]) : elem(r, r->buf, r->displs[me]);
        size_t len = rs ? r->counts[p] : mine;
        DEAR_MPI_CHECK(MPI_Isend(src, (int)(len * r->esize), MPI_BYTE, p, r->tag, r->comm, &st->reqs[n++]));
        r->bytes_sent += len * r->esize;
    }
    st->nreq = n;
    st->ndone = 0;
    return DEAR_OK;
}

/* All pieces of this rank's chunk are in: out = (own + piece_1 + ... + piece_{P-1}) * scale. */
static void reduce_pieces(dear_coll_req_t *r, const direct_state_t *st)
{
    size_t mine = r->counts[r->rank];
    const char *own = elem(r, r->src, r->displs[r->rank]);
    for (int i = 1; i < r->nranks; i++) {
        const char *piece = st->slots + (size_t)(i - 1) * mine * r->esize;
        double scale = i == r->nranks - 1 ? r->scale : 1.0;
        dear_reduce_sum(r->dtype, r->out, i == 1 ? own : r->out, piece, mine, scale);
    }
}

static int direct_progress(dear_coll_req_t *r, int *done)
{
    direct_state_t *st = r->state;
    while (st->phase < st->nphases) {
        for (int i = 0; i < st->nreq; i++) {
            if (st->reqs[i] == MPI_REQUEST_NULL)
                continue;
            int flag = 0;
            DEAR_CHECK(dear_coll_test(&st->reqs[i], &flag));
            if (flag) {
                st->ndone++;
                r->events++;
            }
        }
        if (st->ndone < st->nreq)
            return DEAR_OK;
        if (st->ops[st->phase] == DEAR_COLL_REDUCE_SCATTER)
            reduce_pieces(r, st);
        if (++st->phase < st->nphases)
            DEAR_CHECK(phase_post(r, st));
    }
    *done = 1;
    return DEAR_OK;
}

static int direct_start(dear_coll_req_t *r)
{
    int rc = DEAR_OK;
    direct_state_t *st = NULL;
    DEAR_ALLOC_GOTO(st, calloc(1, sizeof *st), sizeof *st, rc, out);
    r->state = st;
    size_t nb = 2 * (size_t)r->nranks * sizeof(MPI_Request);
    DEAR_ALLOC_GOTO(st->reqs, malloc(nb), nb, rc, out);
    for (int i = 0; i < 2 * r->nranks; i++)
        st->reqs[i] = MPI_REQUEST_NULL;
    /* Each message is one chunk and MPI counts are ints. */
    for (int p = 0; p < r->nranks; p++) {
        if (r->counts[p] > INT_MAX / r->esize) {
            DEAR_ERROR("coll", "direct: chunk of %zu elements exceeds one MPI message (2 GiB); use ring",
                       r->counts[p]);
            return DEAR_ERR_UNSUPPORTED;
        }
    }
    if (r->nranks == 1) {
        if (r->op == DEAR_COLL_REDUCE_SCATTER)
            dear_reduce_scale(r->dtype, r->out, r->src, r->total, r->scale);
        else if (r->op == DEAR_COLL_ALLREDUCE)
            dear_reduce_scale(r->dtype, r->buf, r->src, r->total, r->scale);
        return DEAR_OK;  /* no phases */
    }
    switch (r->op) {
    case DEAR_COLL_REDUCE_SCATTER:
        st->ops[0] = DEAR_COLL_REDUCE_SCATTER;
        st->nphases = 1;
        break;
    case DEAR_COLL_ALLGATHER:
        st->ops[0] = DEAR_COLL_ALLGATHER;
        st->nphases = 1;
        break;
    default:
        st->ops[0] = DEAR_COLL_REDUCE_SCATTER;
        st->ops[1] = DEAR_COLL_ALLGATHER;
        st->nphases = 2;
        r->out = r->buf + r->displs[r->rank] * r->esize;
        break;
    }
    if (st->ops[0] == DEAR_COLL_REDUCE_SCATTER) {
        size_t sb = (size_t)(r->nranks - 1) * r->counts[r->rank] * r->esize + 1;
        DEAR_ALLOC_GOTO(st->slots, malloc(sb), sb, rc, out);
    }
    DEAR_CHECK(phase_post(r, st));
out:
    return rc;
}

static void direct_cleanup(dear_coll_req_t *r)
{
    direct_state_t *st = r->state;
    if (st == NULL)
        return;
    if (st->reqs != NULL)
        for (int i = 0; i < 2 * r->nranks; i++)
            dear_coll_abandon(&st->reqs[i]);
    free(st->reqs);
    free(st->slots);
    free(st);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_direct_ops = { "direct", direct_start, direct_progress, direct_cleanup };

/*
 * Algorithm `mpi`: Open MPI's own non-blocking collectives behind the dear_coll interface, for
 * comparison and as a fallback. MPI_Ireduce_scatter with the shard rule's uneven counts,
 * MPI_Iallgatherv in place, MPI_Iallreduce. bfloat16 and float16 are gathered as MPI_UINT16_T
 * and reduced on a float32 copy (the dispatcher's), so MPI's own sums never round them; compressed
 * float32 (wire16) is reduced in its 16-bit type by an MPI operation of ours that adds in float32
 * and rounds each partial sum once (dear_coll_mpi_sum). The
 * scale is applied after completion. MPI works on a private copy of the vector (priv), copied
 * back on completion: a non-blocking collective can be neither cancelled nor freed, so one
 * abandoned after an error goes on writing when any later MPI call progresses it, and it must
 * not write into buffers the runtime frees or the application reuses; it is leaked with its
 * copy instead. Open MPI's counts are ints: larger vectors fail with DEAR_ERR_UNSUPPORTED.
 */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "base/mpi_check.h"
#include "base/log.h"

typedef struct {
    MPI_Request req;
    int *counts, *displs;
    char *priv;                 /* the vector MPI works on (total elements) */
    size_t priv_cap;
} mpi_state_t;

/* inout = round(float32(in) + float32(inout)), through the host row: MPI hands us its own host
 * buffers. */
static void sum16(dear_dtype_t t, void *in, void *inout, const int *len)
{
    (void)dear_mem_host_ops.sum(NULL, t, inout, inout, in, (size_t)*len, 1.0);
}
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    sum16(DEAR_BFLOAT16, in, inout, len);
}
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    sum16(DEAR_FLOAT16, in, inout, len);
}

static MPI_Op sum_ops[2] = { MPI_OP_NULL, MPI_OP_NULL };
static pthread_once_t sum_once = PTHREAD_ONCE_INIT;

static void sum_create(void)
{
    if (MPI_Op_create(sum_bf16, 1, &sum_ops[0]) != MPI_SUCCESS || MPI_Op_create(sum_f16, 1, &sum_ops[1]) != MPI_SUCCESS)
        DEAR_ERROR("coll", "algo mpi: MPI_Op_create failed for the 16-bit sums");
}

MPI_Op dear_coll_mpi_sum(dear_dtype_t dtype)
{
    if (!dear_dtype_is16(dtype))
        return MPI_SUM;
    pthread_once(&sum_once, sum_create);
    return sum_ops[dtype == DEAR_FLOAT16];
}

static int int_counts(dear_coll_req_t *r, mpi_state_t *s)
{
    int rc = DEAR_OK;
    size_t nb = (size_t)r->nranks * sizeof(int);
    DEAR_ALLOC_GOTO(s->counts, malloc(nb), nb, rc, out);
    DEAR_ALLOC_GOTO(s->displs, malloc(nb), nb, rc, out);
    for (int p = 0; p < r->nranks; p++) {
        if (r->counts[p] > INT_MAX || r->displs[p] > INT_MAX) {
            DEAR_ERROR("coll", "algo mpi: %zu elements exceed Open MPI's int counts; use ring or rhd",
                       r->total);
            return DEAR_ERR_UNSUPPORTED;
        }
        s->counts[p] = (int)r->counts[p];
        s->displs[p] = (int)r->displs[p];
    }
out:
    return rc;
}

static int mpi_start(dear_coll_req_t *r)
{
    int rc = DEAR_OK;
    mpi_state_t *s = NULL;
    DEAR_ALLOC_GOTO(s, calloc(1, sizeof *s), sizeof *s, rc, out);
    s->req = MPI_REQUEST_NULL;
    r->state = s;
    /* 16-bit reductions reach this algorithm as float32 (coll.c's widen_setup), compressed ones
     * as their 16-bit type. */
    MPI_Op op = dear_coll_mpi_sum(r->dtype);
    if (op == MPI_OP_NULL)
        return DEAR_ERR_MPI;
    MPI_Datatype t = dear_coll_mpi_type(r->dtype);
    DEAR_CHECK(int_counts(r, s));
    size_t bytes = r->total * r->esize;
    DEAR_ALLOC_GOTO(s->priv, dear_coll_scratch_get(bytes ? bytes : 1, &s->priv_cap), bytes, rc, out);
    switch (r->op) {
    case DEAR_COLL_REDUCE_SCATTER: /* this rank's shard lands at the start of priv */
        memcpy(s->priv, r->src, bytes);
        DEAR_MPI_CHECK(MPI_Ireduce_scatter(MPI_IN_PLACE, s->priv, s->counts, t, op, r->comm, &s->req));
        break;
    case DEAR_COLL_ALLGATHER: {
        size_t at = r->displs[r->rank] * r->esize;
        memcpy(s->priv + at, r->buf + at, r->counts[r->rank] * r->esize);
        DEAR_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, t, s->priv, s->counts, s->displs, t, r->comm,
                                       &s->req));
        break;
    }
    default:
        if (r->total > INT_MAX) {
            DEAR_ERROR("coll", "algo mpi: %zu elements exceed Open MPI's int counts", r->total);
            return DEAR_ERR_UNSUPPORTED;
        }
        memcpy(s->priv, r->src, bytes);
        DEAR_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, s->priv, (int)r->total, t, op, r->comm, &s->req));
        break;
    }
out:
    return rc;
}

static int mpi_progress(dear_coll_req_t *r, int *done)
{
    mpi_state_t *s = r->state;
    int flag = 0;
    DEAR_MPI_CHECK(MPI_Test(&s->req, &flag, MPI_STATUS_IGNORE));
    if (!flag)
        return DEAR_OK;
    size_t own = r->counts[r->rank], rest = r->total - own;
    switch (r->op) {
    case DEAR_COLL_REDUCE_SCATTER:
        memcpy(r->out, s->priv, own * r->esize);
        coll_rs_final(r, r->out, own);
        r->bytes_sent = rest * r->esize;  /* what a ring would send: an estimate */
        break;
    case DEAR_COLL_ALLGATHER:
        memcpy(r->buf, s->priv, r->total * r->esize);
        r->bytes_sent = rest * r->esize;
        break;
    default:
        coll_scale(r, r->dtype, r->buf, s->priv, r->total, r->scale);
        r->bytes_sent = 2 * rest * r->esize;
        break;
    }
    r->events++;
    *done = 1;
    return DEAR_OK;
}

static void mpi_cleanup(dear_coll_req_t *r)
{
    mpi_state_t *s = r->state;
    if (s == NULL)
        return;
    /* A collective request cannot be cancelled or freed while active; that only happens when
     * the caller abandons a failed or unfinished request: it is leaked with everything it may
     * still read or write. */
    if (s->req != MPI_REQUEST_NULL) {
        DEAR_WARN("coll", "algo mpi: request freed before completion; its MPI request and its %zu-byte copy are "
                          "leaked",
                  s->priv_cap);
        r->state = NULL;
        return;
    }
    dear_coll_scratch_put(s->priv, s->priv_cap);
    free(s->counts);
    free(s->displs);
    free(s);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_mpi_ops = { "mpi", mpi_start, mpi_progress, mpi_cleanup, NULL };

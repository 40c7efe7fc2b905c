/*
 * Algorithm `native`: the collective as the transport runs it itself (net.h coll_start: NCCL on
 * device memory, on its stream). The dispatcher hands the caller's arguments over unchanged
 * (coll.c native_start); completion is the transport's test.
 */
#include "base/check.h"
#include "collectives/coll_impl.h"

static int native_start_algo(dear_coll_req_t *r)
{
    const dear_transport_ops_t *ops = r->net->tp->ops;
    DEAR_CHECK(ops->coll_start(r->net, &r->native_args, &r->state));
    r->bytes_sent = r->total * r->esize; /* what the transport moves for it: an estimate */
    return DEAR_OK;
}

static int native_progress(dear_coll_req_t *r, int *done)
{
    DEAR_CHECK(r->net->tp->ops->coll_test(r->state, done));
    if (*done)
        r->events++;
    return DEAR_OK;
}

static void native_cleanup(dear_coll_req_t *r)
{
    if (r->state != NULL)
        r->net->tp->ops->coll_release(r->state);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_native_ops = {
    .name = "native",
    .start = native_start_algo,
    .progress = native_progress,
    .cleanup = native_cleanup,
};

/*
 * Algorithm `ring`: bandwidth-optimal reduce-scatter and all-gather over a ring of P ranks,
 * pipelined in segments of DEAR_COLL_SEGMENT bytes (the dispatcher composes the all-reduce). At step s (0..P-2) of the reduce-scatter rank r sends chunk r-s-1 and receives chunk
 * r-s-2 (mod P), adds it to its own data and forwards the sum at step s+1; after P-1 steps it
 * holds the full sum of chunk r (the shard rule's shard). The all-gather is the same walk
 * without the additions, chunk r-s out and r-s-1 in.
 *
 * Each chunk travels as segments; up to RING_WINDOW receives and sends are outstanding at
 * once, so the reduction of one segment overlaps the transfer of the next. A segment's forward
 * (step s+1) is posted as soon as its reduction (step s) is done. Receives complete in posting
 * order (one source, one tag), which keeps both sides' views of the sequence identical.
 *
 * 16-bit floating types keep their partial sums in float32 (a float32 work vector, float32
 * messages after the first step, which carries the input itself) and round once, at the last
 * step: the sum is the same whatever the rank count. Compressed float32 (wire16, coll.h) is the
 * other way round: the partial sums travel in 16 bits, each rounded once per hop after a float32
 * addition of this rank's float32 input, and the last step writes the float32 result.
 *
 * Buffers: the reduce-scatter reads the input, receives into RING_WINDOW segment slots and
 * writes partial sums into a work vector, which is the input itself when in place (zero copy)
 * and the output vector for an out-of-place all-reduce; only an out-of-place reduce-scatter
 * needs a separate one, from the scratch cache (coll.c). The last addition writes the result
 * with the scale fused in. Slots are freed as soon as their reduction is done, never held by
 * a send, so receives never wait on sends and the ring cannot deadlock whatever the MPI
 * protocol. (Keeping partial sums in the slots until forwarded would save the work vector,
 * but a slot held by an unmatched rendezvous send can stall every rank's receives at once.)
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "base/mpi_check.h"
#include "base/log.h"
#include "base/params.h"

#define RING_WINDOW 8

typedef struct {
    int step;
    size_t k;   /* segment within the step's chunk */
} cursor_t;

typedef struct {
    int trivial;                /* one rank: nothing travels, done at start */
    int wide;                   /* 16-bit reduce-scatter: partial sums travel as float32 */
    float *wide_work;           /* wide: the float32 partial sums (scratch of total elements) */
    size_t wide_cap;
    size_t slot_esize;          /* bytes per element of a receive slot */
    size_t seg;                 /* elements per segment */
    int left, right;
    size_t nsend, nrecv;        /* items to send and receive */
    size_t send_posted, send_done, recv_posted, recv_done;
    cursor_t sc, rpost, rdone;
    size_t *recv_first;         /* recv item index of the first segment of each step */
    dear_net_req_t sreq[RING_WINDOW], rreq[RING_WINDOW];
    char *slots;
} ring_state_t;

static int mod(int a, int p) { return ((a % p) + p) % p; }

static int send_chunk(const dear_coll_req_t *r, const ring_state_t *st, int step)
{
    int off = r->op == DEAR_COLL_REDUCE_SCATTER ? 1 : 0;
    return mod(r->rank - step - off, r->nranks);
}

static int recv_chunk(const dear_coll_req_t *r, const ring_state_t *st, int step)
{
    return send_chunk(r, st, step + 1);
}

static size_t nseg(const ring_state_t *st, size_t count) { return (count + st->seg - 1) / st->seg; }

/* Move the cursor to the next existing segment (steps with empty chunks have none). */
static void cursor_norm(const dear_coll_req_t *r, const ring_state_t *st, cursor_t *c, int recv)
{
    while (c->step < r->nranks - 1) {
        int chunk = recv ? recv_chunk(r, st, c->step) : send_chunk(r, st, c->step);
        if (c->k < nseg(st, r->counts[chunk]))
            return;
        c->step++;
        c->k = 0;
    }
}

static void cursor_next(const dear_coll_req_t *r, const ring_state_t *st, cursor_t *c, int recv)
{
    c->k++;
    cursor_norm(r, st, c, recv);
}

static void items_setup(dear_coll_req_t *r, ring_state_t *st)
{
    st->nsend = st->nrecv = 0;
    for (int s = 0; s < r->nranks - 1; s++) {
        st->recv_first[s] = st->nrecv;
        st->nsend += nseg(st, r->counts[send_chunk(r, st, s)]);
        st->nrecv += nseg(st, r->counts[recv_chunk(r, st, s)]);
    }
    st->send_posted = st->send_done = st->recv_posted = st->recv_done = 0;
    st->sc = st->rpost = st->rdone = (cursor_t){ 0, 0 };
    cursor_norm(r, st, &st->sc, 0);
    cursor_norm(r, st, &st->rpost, 1);
    cursor_norm(r, st, &st->rdone, 1);
}

static size_t seg_len(const dear_coll_req_t *r, const ring_state_t *st, int chunk, size_t k)
{
    size_t left = r->counts[chunk] - k * st->seg;
    return left < st->seg ? left : st->seg;
}

static char *elem(const dear_coll_req_t *r, const void *base, size_t index)
{
    return (char *)base + index * r->esize;
}

/* Bytes per element of what travels at a step: wide partial sums are float32 after the first
 * step, which carries the input itself. */
static size_t step_esize(const dear_coll_req_t *r, const ring_state_t *st, int step)
{
    return st->wide && step > 0 ? sizeof(float) : r->esize;
}

static int post_send(dear_coll_req_t *r, ring_state_t *st)
{
    const cursor_t *c = &st->sc;
    int chunk = send_chunk(r, st, c->step);
    size_t n = seg_len(r, st, chunk, c->k), at = r->displs[chunk] + c->k * st->seg;
    size_t es = step_esize(r, st, c->step);
    const char *p;
    if (r->op == DEAR_COLL_ALLGATHER)
        p = elem(r, r->buf, at);
    else if (c->step == 0 && r->wire_lazy) /* compressed: the input rounded only where it travels */
        coll_narrow(r, r->dtype, (char *)(p = elem(r, r->src, at)), r->src32 + at, n, 1.0);
    else if (c->step == 0)
        p = elem(r, r->src, at);
    else
        p = st->wide ? (const char *)(st->wide_work + at) : elem(r, r->work, at);
    DEAR_CHECK(dear_net_isend(r->net, p, n * es, st->right, r->tag, &st->sreq[st->send_posted % RING_WINDOW]));
    r->bytes_sent += n * es;
    st->send_posted++;
    cursor_next(r, st, &st->sc, 0);
    return DEAR_OK;
}

static int post_recv(dear_coll_req_t *r, ring_state_t *st)
{
    const cursor_t *c = &st->rpost;
    int chunk = recv_chunk(r, st, c->step);
    size_t n = seg_len(r, st, chunk, c->k);
    void *dst;
    if (r->op == DEAR_COLL_ALLGATHER)
        dst = elem(r, r->buf, r->displs[chunk] + c->k * st->seg);
    else
        dst = st->slots + (st->recv_posted % RING_WINDOW) * st->seg * st->slot_esize;
    DEAR_CHECK(dear_net_irecv(r->net, dst, n * step_esize(r, st, c->step), st->left, r->tag,
                              &st->rreq[st->recv_posted % RING_WINDOW]));
    st->recv_posted++;
    cursor_next(r, st, &st->rpost, 1);
    return DEAR_OK;
}

/* wide: the received segment (16-bit input at step 0, float32 partial sums after) plus this
 * rank's input, in float32; the last step rounds once, scaled, into the output. */
static void reduce_recv_wide(dear_coll_req_t *r, ring_state_t *st, char *slot, size_t n, size_t at, size_t k)
{
    float *w = st->wide_work + at;
    int last = st->rdone.step == r->nranks - 2;
    if (st->rdone.step == 0) {
        coll_widen(r, r->dtype, w, elem(r, r->src, at), n);
        coll_widen_acc(r, r->dtype, w, slot, n);
    } else {
        w = (float *)slot; /* float32 partial sums: add the input to them in the slot */
        coll_widen_acc(r, r->dtype, w, elem(r, r->src, at), n);
        if (!last)
            coll_copy(r, st->wide_work + at, w, n * sizeof(float));
    }
    if (last)
        coll_narrow(r, r->dtype, elem(r, r->out, k), w, n, r->scale);
}

/* A received reduce-scatter segment: add it to the input; the last step writes the result. */
static void reduce_recv(dear_coll_req_t *r, ring_state_t *st)
{
    const cursor_t *c = &st->rdone;
    int chunk = recv_chunk(r, st, c->step);
    size_t n = seg_len(r, st, chunk, c->k), at = r->displs[chunk] + c->k * st->seg;
    char *slot = st->slots + (st->recv_done % RING_WINDOW) * st->seg * st->slot_esize;
    int last = c->step == r->nranks - 2;
    const float *a32 = r->src32 != NULL ? r->src32 + at : NULL;
    if (st->wide)
        reduce_recv_wide(r, st, slot, n, at, c->k * st->seg);
    else if (r->wire16 && last)
        coll_wire_add(r, elem(r, r->out, c->k * st->seg), r->out32 ? r->out32 + c->k * st->seg : NULL,
                      elem(r, r->src, at), a32, slot, n, r->scale);
    else if (r->wire16)
        coll_wire_add(r, elem(r, r->work, at), NULL, elem(r, r->src, at), a32, slot, n, 1.0);
    else if (last)
        coll_sum(r, r->dtype, elem(r, r->out, c->k * st->seg), elem(r, r->src, at), slot, n,
                        r->scale);
    else
        coll_sum(r, r->dtype, elem(r, r->work, at), elem(r, r->src, at), slot, n, 1.0);
}

/* Send item at cursor sc may go once the segment it forwards has been reduced/received. */
static int send_ready(const ring_state_t *st)
{
    if (st->sc.step == 0)
        return 1;
    return st->recv_done > st->recv_first[st->sc.step - 1] + st->sc.k;
}

static int ring_progress(dear_coll_req_t *r, int *done)
{
    ring_state_t *st = r->state;
    for (int round = 0; round < 64; round++) {
        int moved = 0, flag;
        while (st->recv_done < st->recv_posted) {
            DEAR_CHECK(dear_net_test(&st->rreq[st->recv_done % RING_WINDOW], &flag));
            if (!flag)
                break;
            if (r->op == DEAR_COLL_REDUCE_SCATTER)
                reduce_recv(r, st);
            st->recv_done++;
            r->events++;
            cursor_next(r, st, &st->rdone, 1);
            moved = 1;
        }
        while (st->send_done < st->send_posted) {
            DEAR_CHECK(dear_net_test(&st->sreq[st->send_done % RING_WINDOW], &flag));
            if (!flag)
                break;
            st->send_done++;
            r->events++;
            moved = 1;
        }
        while (st->recv_posted < st->nrecv && st->recv_posted - st->recv_done < RING_WINDOW) {
            DEAR_CHECK(post_recv(r, st));
            moved = 1;
        }
        while (st->send_posted < st->nsend && st->send_posted - st->send_done < RING_WINDOW &&
               send_ready(st)) {
            DEAR_CHECK(post_send(r, st));
            moved = 1;
        }
        if (st->send_done == st->nsend && st->recv_done == st->nrecv) {
            *done = 1;
            return DEAR_OK;
        }
        if (!moved)
            break;
    }
    return DEAR_OK;
}

static int ring_start(dear_coll_req_t *r)
{
    int rc = DEAR_OK;
    ring_state_t *st = NULL;
    DEAR_ALLOC_GOTO(st, calloc(1, sizeof *st), sizeof *st, rc, out);
    r->state = st;
    for (int i = 0; i < RING_WINDOW; i++)
        st->sreq[i] = st->rreq[i] = DEAR_NET_REQ_NULL;
    /* No segment is longer than the longest chunk: the same messages, and the receive slots are
     * sized by the vector, not by DEAR_COLL_SEGMENT. */
    size_t seg_bytes = (size_t)dear_param_int(DEAR_P_COLL_SEGMENT);
    size_t max_chunk = 0;
    for (int i = 0; i < r->nranks; i++)
        max_chunk = r->counts[i] > max_chunk ? r->counts[i] : max_chunk;
    st->seg = seg_bytes / r->esize > 0 ? seg_bytes / r->esize : 1;
    if (st->seg > max_chunk && max_chunk > 0)
        st->seg = max_chunk;
    st->left = mod(r->rank - 1, r->nranks);
    st->right = mod(r->rank + 1, r->nranks);
    size_t nb = (size_t)r->nranks * sizeof(size_t);
    DEAR_ALLOC_GOTO(st->recv_first, malloc(nb), nb, rc, out);

    if (r->nranks == 1) {
        /* Nothing travels: a reduce-scatter's result is the input, scaled. */
        if (r->op == DEAR_COLL_REDUCE_SCATTER)
            coll_rs_final(r, r->src, r->total);
        st->trivial = 1;
        return DEAR_OK;
    }
    st->wide = r->op == DEAR_COLL_REDUCE_SCATTER && dear_dtype_is16(r->dtype) && !r->wire16;
    st->slot_esize = st->wide ? sizeof(float) : r->esize;
    if (st->wide) {
        st->wide_work = dear_coll_scratch_get(r->total * sizeof(float), &st->wide_cap);
        if (st->wide_work == NULL)
            return DEAR_ERR_NOMEM;
    } else if (r->op == DEAR_COLL_REDUCE_SCATTER && r->work == NULL) {
        r->scratch = dear_coll_scratch_get(r->total * r->esize, &r->scratch_bytes);
        if (r->scratch == NULL)
            return DEAR_ERR_NOMEM;
        r->work = r->scratch;
    }
    if (r->op == DEAR_COLL_REDUCE_SCATTER) {
        size_t sb = RING_WINDOW * st->seg * st->slot_esize;
        DEAR_ALLOC_GOTO(st->slots, malloc(sb), sb, rc, out);
    }
    items_setup(r, st);
    int done = 0;
    rc = ring_progress(r, &done);  /* post the first round */
out:
    return rc;
}

/* ring_progress reports done through *done; a one-rank request is done at once. */
static int ring_progress_entry(dear_coll_req_t *r, int *done)
{
    ring_state_t *st = r->state;
    if (st->trivial) {
        *done = 1;
        return DEAR_OK;
    }
    return ring_progress(r, done);
}

static void ring_each_req(dear_coll_req_t *r, dear_net_req_fn_t fn, void *arg)
{
    ring_state_t *st = r->state;
    for (int i = 0; i < RING_WINDOW; i++) {
        fn(&st->sreq[i], arg);
        fn(&st->rreq[i], arg);
    }
}

static void ring_cleanup(dear_coll_req_t *r)
{
    ring_state_t *st = r->state;
    if (st == NULL)
        return;
    ring_each_req(r, dear_coll_abandon_one, NULL);
    free(st->slots);
    free(st->recv_first);
    dear_coll_scratch_put(st->wide_work, st->wide_cap);
    free(st);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_ring_ops = { "ring", ring_start, ring_progress_entry,
                                                  ring_cleanup, ring_each_req };

/*
 * Algorithm `hier`: two levels for a communicator of H hosts x L ranks (dear_coll_topo_t),
 * pipelined over segments. Over one flat ring every host link carries (P-1)/P of the vector per
 * phase; reducing inside the host first (MPI's shared memory, or the socket transport's rings
 * between ranks of a host) leaves (H-1)/H for the links: with 2 hosts x 2 ranks, half the vector
 * instead of three quarters.
 *
 * Rank (h, l) must end with the chunk the flat layout gives it, chunk c(h, l) of rank
 * rank_of(h, l), so the result is the same whichever algorithm ran (and the runtime's
 * all-gathers, which address the shards of the flat rule, fit either). Every chunk is cut into
 * nseg pieces by the shard rule; segment k is piece k of every chunk. Each segment goes through
 * up to four stages, each a lane that runs its units in segment order:
 *   NRS  reduce-scatter inside the host, one unit per segment and host g: local j ends with
 *        this host's sum of piece k of the chunk of host g it holds (held() below);
 *   XRS  across the hosts: rank (h, l) ends with the full sum of piece k of c(h, l), scaled;
 *   XAG  across the hosts: rank (h, l) receives the pieces k it holds of the other hosts;
 *   NAG  all-gather inside the host, one unit per segment and host g.
 * A reduce-scatter runs NRS and XRS, an all-gather XAG and NAG, an all-reduce all four (this
 * file's own, so that segment k crosses the hosts while k+1 is reduced and k-1 gathered inside
 * them). A unit starts once its lane's previous unit is done and the stage before has finished
 * its segment, so the lanes overlap; each lane has communicators of its own (node[0] for NRS,
 * node[1] for NAG, cross[0] for XRS, cross[1] for XAG) and starts its units in the same order
 * on every rank, so units of one request never share a communicator and tag at once. The
 * caller's tag is unique among collectives in flight on the parent communicator, so on these too.
 *
 * Across the hosts every local rank carries 1/L of the bytes (L flows share each host's link,
 * and the reductions spread over all ranks):
 *   H >= 3  a ring (coll_ring.c) among the ranks of equal local index per segment; a ring sends
 *           to one neighbour and receives from the other, so each connection carries one
 *           direction.
 *   H == 2  a ring of two would send and receive on one connection, which Open MPI's TCP
 *           transport carries at about half the rate (docs/PERFORMANCE.md#hier). Instead rank
 *           (0, l) sends to (1, l-1) and receives from (1, l), rank (1, l) sends to (0, l) and
 *           receives from (0, l+1) (mod L): every connection carries one direction, in both
 *           phases. Up to HIER_WINDOW segments are in flight on each stream.
 * Inside the host each unit is the direct exchange up to DIRECT_INSIDE bytes, else the ring, on
 * the step's pieces of the caller's vectors (no packing). Sums are taken in another order than a
 * flat algorithm's, once per element, and every rank gathers the owner's result: all ranks end
 * with identical data. 16-bit sums are left to the dispatcher, which widens them (partial sums
 * cross the hosts, so they would travel in float32 anyway). Compressed float32 (wire16) runs in
 * its 16-bit type: the host's partial sums cross rounded, the first stage adds this rank's
 * float32 input and the last writes the float32 result.
 * int8 (r->q8, one phase at a time: the dispatcher composes an all-reduce) quantizes only what
 * crosses the hosts, once: inside the host every stage moves float32, so a rank's contribution
 * is summed exactly into its host's partial sum; XRS sends that partial sum quantized (the owner
 * adds the values in float32) and XAG the owner's final piece, whose values the owner takes too,
 * so every rank holds the same bits. Pairs pack and unpack each segment on the streams; rings
 * become the direct exchange among the hosts, which does the same (coll_direct.c). With r->ef
 * each quantization keeps what it dropped at the elements it sent.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "base/check.h"
#include "base/log.h"
#include "base/mpi_check.h"
#include "base/params.h"

/* On shared memory the direct exchange beat the ring up to 1 MiB (coll.c's table, row 0). */
#define DIRECT_INSIDE ((size_t)1 << 20)
/* Segments in flight per stream between two hosts: a completed message must find the next one
 * already posted, or the link idles for a round trip at every segment. */
#define HIER_WINDOW 4

enum { ST_NRS, ST_XRS, ST_XAG, ST_NAG, ST_COUNT };

/* A stage run as one sub-collective per unit, one at a time. */
typedef struct {
    dear_coll_req_t *sub;
    int next, done;             /* units started, units completed (in order) */
} lane_t;

/* H == 2: a stage run as a stream of point-to-point messages, one per segment each way. */
typedef struct {
    dear_net_req_t sreq[HIER_WINDOW], rreq[HIER_WINDOW];
    int sent, recvd, done;      /* segments whose send / receive is posted; completed */
} stream_t;

typedef struct {
    int nseg;
    int first, last;            /* the stages this operation runs, ST_* */
    int pair;                   /* H == 2: the streams between the hosts, else rings */
    int to, from;               /* pair: this rank's partners on the other host (ranks of comm) */
    lane_t lane[ST_COUNT];
    stream_t stream[2];         /* pair: XRS, XAG */
    char *slots;                /* pair: received partial sums, HIER_WINDOW pieces */
    size_t slot_count;
    int q8;                     /* the phase crosses the hosts as int8 (r->q8 at start) */
    char *q8_send;              /* pair, int8: HIER_WINDOW packed pieces on their way out */
    char *q8_recv;              /* pair, int8 all-gather: HIER_WINDOW packed pieces arriving */
    size_t q8_slot;             /* bytes per packed piece, aligned */
    size_t *counts, *displs;    /* a unit's layout (max(H, L) entries) */
    const char *src;            /* a reduction's input */
    char *vec;                  /* the vector the stages work on, in place */
    char *own;                  /* where this rank's final chunk goes */
} hier_state_t;

/* H == 2: the rank of comm that (h, l) sends to, or receives from, on the other host. */
static int pair_to(const dear_coll_topo_t *t, int h, int l)
{
    int L = t->local_size;
    return h == 0 ? t->rank_of[L + (l + L - 1) % L] : t->rank_of[l];
}

static int pair_from(const dear_coll_topo_t *t, int h, int l)
{
    int L = t->local_size;
    return h == 0 ? t->rank_of[L + l] : t->rank_of[(l + 1) % L];
}

/* The rank whose chunk local j of this host holds in host g's units of the reduce-scatter
 * (ag 0) or the all-gather (ag 1): its own column for the rings; with H == 2, of the other host,
 * the chunk of the partner it sends the partial sum to, or receives the result from. */
static int held(const hier_state_t *st, const dear_coll_topo_t *t, int ag, int g, int j)
{
    if (!st->pair || g == t->host)
        return t->rank_of[g * t->local_size + j];
    return ag ? pair_from(t, t->host, j) : pair_to(t, t->host, j);
}

/* Piece k of rank p's chunk: *at its first element in the vector, *n its elements. */
static void piece(const dear_coll_req_t *r, const hier_state_t *st, int p, int k, size_t *at, size_t *n)
{
    size_t off;
    dear_coll_shard(r->counts[p], st->nseg, k, &off, n);
    *at = r->displs[p] + off;
}

/* Host g of a node unit: this host's units visit the other hosts first (with H == 2 the sends
 * across wait only for those), then its own. */
static int unit_host(const dear_coll_topo_t *t, int unit)
{
    return (t->host + 1 + unit % t->nhosts) % t->nhosts;
}

/* Segments a stage has finished; a stage this operation does not run counts as finished. */
static int segs_done(const dear_coll_req_t *r, const hier_state_t *st, int s)
{
    if (s < st->first || s > st->last)
        return st->nseg;
    if (st->pair && (s == ST_XRS || s == ST_XAG))
        return st->stream[s == ST_XAG].done;
    if (s == ST_NRS || s == ST_NAG)
        return st->lane[s].done / r->topo->nhosts;
    return st->lane[s].done;
}

static int start_unit(dear_coll_req_t *r, hier_state_t *st, int s)
{
    const dear_coll_topo_t *t = r->topo;
    lane_t *ln = &st->lane[s];
    int ag = s == ST_XAG || s == ST_NAG, node = s == ST_NRS || s == ST_NAG;
    dear_coll_op_t op = ag ? DEAR_COLL_ALLGATHER : DEAR_COLL_REDUCE_SCATTER;
    int n = node ? t->local_size : t->nhosts, me = node ? t->local : t->host;
    int k = node ? ln->next / t->nhosts : ln->next, g = unit_host(t, ln->next);
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        int p = node ? held(st, t, ag, g, i) : t->rank_of[i * t->local_size + t->local];
        piece(r, st, p, k, &st->displs[i], &st->counts[i]);
        bytes += st->counts[i] * r->esize;
    }
    /* int8 across the hosts: partial sums cannot travel quantized, so no ring. */
    dear_coll_algo_t algo = node ? (bytes > DIRECT_INSIDE ? DEAR_ALGO_RING : DEAR_ALGO_DIRECT)
                                 : (st->q8 ? DEAR_ALGO_DIRECT : DEAR_ALGO_RING);
    char *out = st->vec + st->displs[me] * r->esize;
    if (s == ST_XRS) /* the final sum, into this rank's chunk */
        out = st->own + (st->displs[me] - r->displs[r->rank]) * r->esize;
    ln->next++;
    const dear_net_t *net = node ? t->node_net[ag] : t->cross_net[ag];
    /* Compressed: the first stage adds this rank's float32 input, the last writes the result. */
    const float *src32 = s == ST_NRS ? r->src32 : NULL;
    float *out32 = s == ST_XRS && r->out32 != NULL ? r->out32 + (size_t)(out - r->out) / r->esize : NULL;
    return dear_coll_sub_start32(r, op, algo, net, me, n, st->counts, st->displs, s == ST_NRS ? st->src : st->vec,
                                 src32, st->vec, out, out32, s == ST_XRS ? r->scale : 1.0, st->q8 && !node, &ln->sub);
}

/* May the lane of stage s start its next unit? */
static int unit_ready(const dear_coll_req_t *r, const hier_state_t *st, int s)
{
    const lane_t *ln = &st->lane[s];
    if (ln->sub != NULL)
        return 0;
    int H = r->topo->nhosts, node = s == ST_NRS || s == ST_NAG;
    if (ln->next >= (node ? st->nseg * H : st->nseg))
        return 0;
    return s == ST_NRS || segs_done(r, st, s - 1) > (node ? ln->next / H : ln->next);
}

static int lane_progress(dear_coll_req_t *r, hier_state_t *st, int s, int *moved)
{
    lane_t *ln = &st->lane[s];
    if (ln->sub != NULL) {
        int d = 0;
        size_t ev = ln->sub->events;
        DEAR_CHECK(dear_coll_progress(ln->sub, &d));
        r->events += ln->sub->events - ev;
        if (d) {
            r->bytes_sent += ln->sub->bytes_sent;
            dear_coll_free(ln->sub);
            ln->sub = NULL;
            ln->done++;
            *moved = 1;
        }
    }
    if (unit_ready(r, st, s)) {
        DEAR_CHECK(start_unit(r, st, s));
        *moved = 1;
    }
    return DEAR_OK;
}

/* Test a stream request; 1 once it has completed (counted as an event when it does). */
static int stream_test(dear_coll_req_t *r, dear_net_req_t *q, int *rc)
{
    int flag = 1;
    if (dear_net_active(q)) {
        *rc = dear_net_test(q, &flag);
        if (*rc != DEAR_OK)
            return 0;
        r->events += (size_t)flag;
    }
    return flag;
}

/* H == 2, stage XRS (ag 0) or XAG (ag 1): post what the window and the stages before allow,
 * complete segments in order. The reduce-scatter sends this host's partial sum of piece k of
 * the partner's chunk once the node unit that made it is done (the first of segment k) and adds
 * the one received to this host's sum of its own piece once both node units are; the all-gather
 * sends this rank's final piece and receives the partner's into the vector (for an all-reduce
 * only after this rank's input there has been consumed by NRS). int8 packs each piece as it is
 * sent and unpacks it once it is complete. */
static int stream_progress(dear_coll_req_t *r, hier_state_t *st, int ag, int *moved)
{
    const dear_coll_topo_t *t = r->topo;
    stream_t *x = &st->stream[ag];
    const dear_net_t *net = t->cross_net[ag];
    int rc = DEAR_OK, nrs_units = st->lane[ST_NRS].done;
    int nrs_segs = segs_done(r, st, ST_NRS), xrs_segs = segs_done(r, st, ST_XRS);
    while (x->done < x->sent && x->done < x->recvd) {
        int w = x->done % HIER_WINDOW, k = x->done;
        int fs = stream_test(r, &x->sreq[w], &rc), fr = rc == DEAR_OK && stream_test(r, &x->rreq[w], &rc);
        DEAR_CHECK(rc);
        if (!fs || !fr || (!ag && nrs_segs <= k))
            break;
        if (st->q8) {
            size_t at, n;
            piece(r, st, ag ? st->from : r->rank, k, &at, &n);
            float *v = (float *)st->vec + at;
            if (ag) {
                dear_reduce_q8_unpack(v, st->q8_recv + (size_t)w * st->q8_slot, n, 0);
            } else {
                float *o = (float *)st->own + (at - r->displs[r->rank]);
                if (o != v)
                    coll_copy(r, o, v, n * sizeof(float));
                dear_reduce_q8_unpack(o, st->slots + (size_t)w * st->q8_slot, n, 1);
                coll_scale(r, DEAR_FLOAT32, o, o, n, r->scale);
            }
        } else if (!ag) {
            size_t at, n;
            piece(r, st, r->rank, k, &at, &n);
            size_t e = at - r->displs[r->rank];
            const char *slot = st->slots + (size_t)w * st->slot_count * r->esize;
            if (r->wire16)
                coll_wire_add(r, st->own + e * r->esize, r->out32 ? r->out32 + e : NULL, st->vec + at * r->esize, NULL,
                              slot, n, r->scale);
            else
                coll_sum(r, r->dtype, st->own + e * r->esize, st->vec + at * r->esize, slot, n, r->scale);
        }
        x->done++;
        *moved = 1;
    }
    while (x->recvd < st->nseg && x->recvd < x->done + HIER_WINDOW && (!ag || nrs_segs > x->recvd)) {
        int k = x->recvd, w = k % HIER_WINDOW;
        size_t at, n;
        piece(r, st, ag ? st->from : r->rank, k, &at, &n);
        void *dst = ag ? st->vec + at * r->esize : st->slots + (size_t)w * st->slot_count * r->esize;
        size_t len = n * r->esize;
        if (st->q8) {
            dst = (ag ? st->q8_recv : st->slots) + (size_t)w * st->q8_slot;
            len = dear_q8_bytes(n);
        }
        DEAR_CHECK(dear_net_irecv(net, dst, len, st->from, r->tag, &x->rreq[w]));
        x->recvd++;
        *moved = 1;
    }
    while (x->sent < st->nseg && x->sent < x->done + HIER_WINDOW &&
           (ag ? xrs_segs > x->sent : nrs_units > x->sent * t->nhosts)) {
        int k = x->sent, w = k % HIER_WINDOW;
        size_t at, n;
        piece(r, st, ag ? r->rank : st->to, k, &at, &n);
        char *p = ag ? st->own + (at - r->displs[r->rank]) * r->esize : st->vec + at * r->esize;
        size_t len = n * r->esize;
        if (st->q8) {
            /* The owner takes the values of what it sends, as every receiver will. */
            char *q = st->q8_send + (size_t)w * st->q8_slot;
            dear_reduce_q8_pack(q, (const float *)p, r->ef != NULL ? r->ef + at : NULL, n);
            if (ag)
                dear_reduce_q8_unpack((float *)p, q, n, 0);
            p = q;
            len = dear_q8_bytes(n);
        }
        DEAR_CHECK(dear_net_isend(net, p, len, st->to, r->tag, &x->sreq[w]));
        r->bytes_sent += len;
        x->sent++;
        *moved = 1;
    }
    return DEAR_OK;
}

static int hier_progress(dear_coll_req_t *r, int *done)
{
    hier_state_t *st = r->state;
    for (int round = 0; round < 64; round++) {
        int moved = 0;
        for (int s = st->first; s <= st->last; s++) {
            if (st->pair && (s == ST_XRS || s == ST_XAG))
                DEAR_CHECK(stream_progress(r, st, s == ST_XAG, &moved));
            else
                DEAR_CHECK(lane_progress(r, st, s, &moved));
        }
        if (segs_done(r, st, st->last) == st->nseg) {
            *done = 1;
            return DEAR_OK;
        }
        if (!moved)
            break;
    }
    return DEAR_OK;
}

/* Segments: each rank's piece of one is about DEAR_COLL_SEGMENT bytes, the ring's message, so a
 * segment is P of them (docs/PERFORMANCE.md#hier); none is wholly empty. */
static int hier_nseg(const dear_coll_req_t *r)
{
    size_t seg = (size_t)dear_param_int(DEAR_P_COLL_SEGMENT) / r->esize * (size_t)r->nranks, most = 0;
    for (int p = 0; p < r->nranks; p++)
        most = r->counts[p] > most ? r->counts[p] : most;
    size_t n = seg > 0 ? (r->total + seg - 1) / seg : 1;
    n = n < most ? n : most;
    return n < 1 ? 1 : n > (size_t)(1 << 30) ? 1 << 30 : (int)n;
}

static int hier_start(dear_coll_req_t *r)
{
    int rc = DEAR_OK;
    const dear_coll_topo_t *t = r->topo;
    hier_state_t *st = NULL;
    if (t == NULL || t->nhosts < 2 || t->local_size < 2 || t->nhosts > 64 ||
        t->nhosts * t->local_size != r->nranks) {
        DEAR_ERROR("coll", "hier: needs the communicator's host topology (2..64 hosts of 2 or more ranks each, all "
                           "alike); the dispatcher should have chosen another algorithm");
        return DEAR_ERR_INTERNAL;
    }
    DEAR_ALLOC_GOTO(st, calloc(1, sizeof *st), sizeof *st, rc, out);
    r->state = st;
    for (int a = 0; a < 2; a++)
        for (int w = 0; w < HIER_WINDOW; w++)
            st->stream[a].sreq[w] = st->stream[a].rreq[w] = DEAR_NET_REQ_NULL;
    int n = t->nhosts > t->local_size ? t->nhosts : t->local_size;
    DEAR_ALLOC_GOTO(st->counts, malloc(sizeof(size_t) * (size_t)n), sizeof(size_t) * (size_t)n, rc, out);
    DEAR_ALLOC_GOTO(st->displs, malloc(sizeof(size_t) * (size_t)n), sizeof(size_t) * (size_t)n, rc, out);
    st->nseg = hier_nseg(r);
    st->pair = t->nhosts == 2;
    st->to = st->pair ? pair_to(t, t->host, t->local) : -1;
    st->from = st->pair ? pair_from(t, t->host, t->local) : -1;
    st->first = r->op == DEAR_COLL_ALLGATHER ? ST_XAG : ST_NRS;
    st->last = r->op == DEAR_COLL_REDUCE_SCATTER ? ST_XRS : ST_NAG;
    /* The stages work in place on one vector: the caller's (an all-gather's, an all-reduce's
     * output, an in-place reduce-scatter's input), else scratch for a reduce-scatter's partial
     * sums; NRS reads the input wherever it is. */
    st->src = r->src;
    if (r->op != DEAR_COLL_REDUCE_SCATTER) {
        st->vec = r->buf;
    } else if (r->work != NULL) {
        st->vec = r->work;
    } else {
        r->scratch = dear_coll_scratch_get(r->total * r->esize, &r->scratch_bytes);
        if (r->scratch == NULL)
            return DEAR_ERR_NOMEM;
        st->vec = r->scratch;
    }
    st->own = r->op == DEAR_COLL_REDUCE_SCATTER ? r->out : st->vec + r->displs[r->rank] * r->esize;
    st->q8 = r->q8;
    if (st->q8 && r->op == DEAR_COLL_ALLREDUCE) {
        DEAR_ERROR("coll", "hier: an int8 all-reduce must be composed of its two phases by the dispatcher");
        return DEAR_ERR_INTERNAL;
    }
    if (st->pair && st->q8) {
        /* One packed piece per window position, each as large as the largest chunk's first. */
        size_t off, most = 0, pc;
        for (int p = 0; p < r->nranks; p++)
            most = r->counts[p] > most ? r->counts[p] : most;
        dear_coll_shard(most, st->nseg, 0, &off, &pc);
        st->q8_slot = dear_q8_stride(pc);
        size_t qb = HIER_WINDOW * st->q8_slot + 1;
        DEAR_ALLOC_GOTO(st->q8_send, malloc(qb), qb, rc, out);
        if (r->op == DEAR_COLL_ALLGATHER)
            DEAR_ALLOC_GOTO(st->q8_recv, malloc(qb), qb, rc, out);
        else
            DEAR_ALLOC_GOTO(st->slots, malloc(qb), qb, rc, out);
    } else if (st->pair && r->op != DEAR_COLL_ALLGATHER) {
        size_t off;
        dear_coll_shard(r->counts[r->rank], st->nseg, 0, &off, &st->slot_count);
        size_t sb = HIER_WINDOW * st->slot_count * r->esize + 1;
        DEAR_ALLOC_GOTO(st->slots, malloc(sb), sb, rc, out);
    }
    int done = 0;
    rc = hier_progress(r, &done);  /* post the first units */
out:
    return rc;
}

static void hier_each_req(dear_coll_req_t *r, dear_net_req_fn_t fn, void *arg)
{
    hier_state_t *st = r->state;
    for (int s = 0; s < ST_COUNT; s++)
        dear_coll_each_req(st->lane[s].sub, fn, arg);
    for (int a = 0; a < 2; a++)
        for (int w = 0; w < HIER_WINDOW; w++) {
            fn(&st->stream[a].sreq[w], arg);
            fn(&st->stream[a].rreq[w], arg);
        }
}

static void hier_cleanup(dear_coll_req_t *r)
{
    hier_state_t *st = r->state;
    if (st == NULL)
        return;
    hier_each_req(r, dear_coll_abandon_one, NULL);
    for (int s = 0; s < ST_COUNT; s++)
        dear_coll_free(st->lane[s].sub);
    free(st->slots);
    free(st->q8_send);
    free(st->q8_recv);
    free(st->counts);
    free(st->displs);
    free(st);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_hier_ops = { "hier", hier_start, hier_progress, hier_cleanup,
                                                  hier_each_req };

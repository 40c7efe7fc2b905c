/*
 * Algorithm `rhd`: latency-optimal collectives for small messages, any P, by recursive
 * doubling over the largest power of two p2 <= P with the usual fold of the rem = P - p2 extra
 * ranks: among ranks 0 .. 2*rem-1 each even rank first hands its data to the odd rank above
 * it, which stands in for both, and gets the result back at the end. Rounds: log2(p2) + 2 at
 * most, against 2(P-1) for the ring.
 *   ALLREDUCE       full vectors are exchanged and summed each round; scaled before the
 *                   result goes back to the folded ranks.
 *   REDUCE_SCATTER  recursive halving: each round a rank keeps the half of its current range
 *                   of virtual ranks that holds itself and sends the other half to its
 *                   partner, so the bytes halve every round ((p2-1)/p2 of the vector in all);
 *                   a virtual rank's range is contiguous, the shards of its 1 or 2 real ranks;
 *                   a folded rank receives only its shard at the end.
 *   ALLGATHER       recursive doubling of contiguous rank ranges (a virtual rank's range maps
 *                   to consecutive real ranks, hence to one contiguous piece of the vector),
 *                   in place, no copies.
 * The collective is compiled at start into a list of rounds (send, receive, then a local
 * action), which progress walks without blocking, as libnbc does. All ranks add the same pairs
 * in the same order (IEEE addition commutes), so every rank gets bit-identical results.
 * Compressed float32 (wire16) runs as its 16-bit type: every partial sum rounded, the
 * reduce-scatter's result widened into the float32 output before the scale.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "base/mpi_check.h"
#include "base/log.h"

typedef enum { ACT_NONE, ACT_ACC, ACT_SCALE_ALL, ACT_SCALE_OWN, ACT_SCALE_OUT } action_t;

typedef struct {
    int send_peer, recv_peer;   /* -1: none */
    const char *sbuf;
    char *rbuf;
    size_t sbytes, rbytes;
    action_t action;
    size_t acc_off, acc_len;    /* ACT_ACC: vec[acc_off, +acc_len) += tmp, elements */
} round_t;

typedef struct {
    round_t rounds[72];         /* log2 P + a few; P < 2^64 */
    int nrounds, cur, posted;
    dear_net_req_t req[2];
    char *vec;                  /* the vector the rounds work on (total elements) */
    char *tmp;                  /* receive buffer for sums, from the scratch cache */
    size_t tmp_cap;
} rhd_state_t;

static round_t *add_round(rhd_state_t *st)
{
    round_t *rd = &st->rounds[st->nrounds++];
    *rd = (round_t){ -1, -1, NULL, NULL, 0, 0, ACT_NONE, 0, 0 };
    return rd;
}

/* First real rank of virtual rank v (v == p2 gives nranks). */
static int vlo(int v, int rem) { return v < rem ? 2 * v : v + rem; }

static size_t vdispl(const dear_coll_req_t *r, int v, int rem)
{
    int lo = vlo(v, rem);
    return lo >= r->nranks ? r->total : r->displs[lo];
}

/* Element range [vdispl(a), vdispl(b)) of virtual ranks [a, b). */
static void vrange(const dear_coll_req_t *r, int a, int b, int rem, size_t *off, size_t *len)
{
    *off = vdispl(r, a, rem);
    *len = vdispl(r, b, rem) - *off;
}

static void build_reduce(dear_coll_req_t *r, rhd_state_t *st, int p2, int rem)
{
    int rank = r->rank, vrank;
    size_t es = r->esize, bytes = r->total * es;
    int is_rs = r->op == DEAR_COLL_REDUCE_SCATTER;
    if (rank < 2 * rem && rank % 2 == 0) {
        round_t *rd = add_round(st);
        rd->send_peer = rank + 1, rd->sbuf = st->vec, rd->sbytes = bytes;
        rd = add_round(st);
        rd->recv_peer = rank + 1;
        if (is_rs) {
            rd->rbuf = r->out, rd->rbytes = r->counts[rank] * es, rd->action = ACT_SCALE_OUT;
        } else {
            rd->rbuf = st->vec, rd->rbytes = bytes;
        }
        return;
    }
    if (rank < 2 * rem) {
        round_t *rd = add_round(st);
        rd->recv_peer = rank - 1, rd->rbuf = st->tmp, rd->rbytes = bytes, rd->action = ACT_ACC;
        rd->acc_off = 0, rd->acc_len = r->total;
        vrank = rank / 2;
    } else {
        vrank = rank - rem;
    }
    if (is_rs) {
        /* Recursive halving: keep the half of the current range that holds this virtual
         * rank, hand the other half to the partner; each round halves the bytes. */
        int lo = 0, hi = p2;
        for (int d = p2 / 2; d >= 1; d /= 2) {
            int v = vrank ^ d, peer = v < rem ? 2 * v + 1 : v + rem;
            int mlo = (vrank & d) ? lo + d : lo, olo = (vrank & d) ? lo : lo + d;
            size_t moff, mlen, ooff, olen;
            vrange(r, mlo, mlo + d, rem, &moff, &mlen);
            vrange(r, olo, olo + d, rem, &ooff, &olen);
            round_t *rd = add_round(st);
            rd->send_peer = peer, rd->sbuf = st->vec + ooff * es, rd->sbytes = olen * es;
            rd->recv_peer = peer, rd->rbuf = st->tmp, rd->rbytes = mlen * es, rd->action = ACT_ACC;
            rd->acc_off = moff, rd->acc_len = mlen;
            lo = mlo, hi = mlo + d;
        }
        (void)hi;
    } else {
        for (int d = 1; d < p2; d <<= 1) {
            int v = vrank ^ d, peer = v < rem ? 2 * v + 1 : v + rem;
            round_t *rd = add_round(st);
            rd->send_peer = peer, rd->sbuf = st->vec, rd->sbytes = bytes;
            rd->recv_peer = peer, rd->rbuf = st->tmp, rd->rbytes = bytes, rd->action = ACT_ACC;
            rd->acc_off = 0, rd->acc_len = r->total;
        }
    }
    round_t *rd = add_round(st);
    rd->action = is_rs ? ACT_SCALE_OWN : ACT_SCALE_ALL;
    if (rank < 2 * rem) {
        rd = add_round(st);
        rd->send_peer = rank - 1;
        if (is_rs) {
            rd->sbuf = st->vec + r->displs[rank - 1] * es;
            rd->sbytes = r->counts[rank - 1] * es;
        } else {
            rd->sbuf = st->vec, rd->sbytes = bytes;
        }
    }
}

static void build_gather(dear_coll_req_t *r, rhd_state_t *st, int p2, int rem)
{
    int rank = r->rank, vrank;
    size_t es = r->esize;
    char *v = r->buf;
    if (rank < 2 * rem && rank % 2 == 0) {
        round_t *rd = add_round(st);
        rd->send_peer = rank + 1, rd->sbuf = v + r->displs[rank] * es, rd->sbytes = r->counts[rank] * es;
        rd = add_round(st);
        rd->recv_peer = rank + 1, rd->rbuf = v, rd->rbytes = r->total * es;
        return;
    }
    if (rank < 2 * rem) {
        round_t *rd = add_round(st);
        rd->recv_peer = rank - 1, rd->rbuf = v + r->displs[rank - 1] * es;
        rd->rbytes = r->counts[rank - 1] * es;
        vrank = rank / 2;
    } else {
        vrank = rank - rem;
    }
    for (int d = 1; d < p2; d <<= 1) {
        int mine = vrank & ~(d - 1), theirs = (vrank ^ d) & ~(d - 1);
        int pv = vrank ^ d, peer = pv < rem ? 2 * pv + 1 : pv + rem;
        size_t m0 = vdispl(r, mine, rem), m1 = vdispl(r, mine + d, rem);
        size_t t0 = vdispl(r, theirs, rem), t1 = vdispl(r, theirs + d, rem);
        round_t *rd = add_round(st);
        rd->send_peer = peer, rd->sbuf = v + m0 * es, rd->sbytes = (m1 - m0) * es;
        rd->recv_peer = peer, rd->rbuf = v + t0 * es, rd->rbytes = (t1 - t0) * es;
    }
    if (rank < 2 * rem) {
        round_t *rd = add_round(st);
        rd->send_peer = rank - 1, rd->sbuf = v, rd->sbytes = r->total * es;
    }
}

static void run_action(dear_coll_req_t *r, rhd_state_t *st, const round_t *rd)
{
    size_t own = r->counts[r->rank];
    switch (rd->action) {
    case ACT_ACC: {
        char *v = st->vec + rd->acc_off * r->esize;
        coll_sum(r, r->dtype, v, v, st->tmp, rd->acc_len, 1.0);
        break;
    }
    case ACT_SCALE_ALL: coll_scale(r, r->dtype, st->vec, st->vec, r->total, r->scale); break;
    case ACT_SCALE_OWN: coll_rs_final(r, st->vec + r->displs[r->rank] * r->esize, own); break;
    case ACT_SCALE_OUT: coll_rs_final(r, r->out, own); break;
    case ACT_NONE: break;
    }
}

static int rhd_progress(dear_coll_req_t *r, int *done)
{
    rhd_state_t *st = r->state;
    while (st->cur < st->nrounds) {
        round_t *rd = &st->rounds[st->cur];
        if (!st->posted) {
            if (rd->recv_peer >= 0)
                DEAR_CHECK(dear_net_irecv(r->net, rd->rbuf, rd->rbytes, rd->recv_peer, r->tag, &st->req[0]));
            if (rd->send_peer >= 0) {
                DEAR_CHECK(dear_net_isend(r->net, rd->sbuf, rd->sbytes, rd->send_peer, r->tag, &st->req[1]));
                r->bytes_sent += rd->sbytes;
            }
            st->posted = 1;
        }
        int flag;
        DEAR_CHECK(dear_net_testall(2, st->req, &flag));
        if (!flag)
            return DEAR_OK;
        run_action(r, st, rd);
        r->events++;
        st->posted = 0;
        st->cur++;
    }
    *done = 1;
    return DEAR_OK;
}

static int rhd_start(dear_coll_req_t *r)
{
    int rc = DEAR_OK;
    rhd_state_t *st = NULL;
    DEAR_ALLOC_GOTO(st, calloc(1, sizeof *st), sizeof *st, rc, out);
    r->state = st;
    st->req[0] = st->req[1] = DEAR_NET_REQ_NULL;
    size_t bytes = r->total * r->esize;
    if (bytes > INT_MAX) {
        DEAR_ERROR("coll", "algo rhd: %zu bytes exceed one MPI message; use ring for large vectors",
                   bytes);
        return DEAR_ERR_UNSUPPORTED;
    }
    int p2 = 1;
    while (p2 * 2 <= r->nranks)
        p2 *= 2;
    int rem = r->nranks - p2;

    if (r->op == DEAR_COLL_ALLGATHER) {
        build_gather(r, st, p2, rem);
    } else {
        if (r->op == DEAR_COLL_ALLREDUCE) {
            st->vec = r->buf;
        } else if (r->in_place) {
            st->vec = (char *)r->src;  /* in place: the rest of the vector is scratch */
        } else {
            /* Scratch from the cache: fresh pages cost a fault each, every call. */
            r->scratch = dear_coll_scratch_get(bytes, &r->scratch_bytes);
            if (r->scratch == NULL)
                return DEAR_ERR_NOMEM;
            st->vec = r->scratch;
        }
        if (st->vec != r->src && bytes > 0)
            coll_copy(r, st->vec, r->src, bytes);
        st->tmp = dear_coll_scratch_get(bytes, &st->tmp_cap);
        if (st->tmp == NULL)
            return DEAR_ERR_NOMEM;
        build_reduce(r, st, p2, rem);
    }
    int done = 0;
    rc = rhd_progress(r, &done);
out:
    return rc;
}

static int rhd_progress_entry(dear_coll_req_t *r, int *done)
{
    return rhd_progress(r, done);
}

static void rhd_each_req(dear_coll_req_t *r, dear_net_req_fn_t fn, void *arg)
{
    rhd_state_t *st = r->state;
    fn(&st->req[0], arg);
    fn(&st->req[1], arg);
}

static void rhd_cleanup(dear_coll_req_t *r)
{
    rhd_state_t *st = r->state;
    if (st == NULL)
        return;
    rhd_each_req(r, dear_coll_abandon_one, NULL);
    dear_coll_scratch_put(st->tmp, st->tmp_cap);
    free(st);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_rhd_ops = { "rhd", rhd_start, rhd_progress_entry, rhd_cleanup,
                                                 rhd_each_req };

/*
 * Algorithm `direct`: every rank exchanges with every other rank at once, in one round.
 * The reduce-scatter sends chunk p of the input straight to rank p and receives the P-1 pieces
 * of its own chunk, then adds them in rank order (deterministic, with the scale fused into the
 * last addition; 16-bit types in float32, rounded once; compressed float32 from this rank's own
 * float32 input, into the float32 result); the all-gather sends this rank's shard to all others and receives theirs in
 * place (the dispatcher composes the all-reduce). Each rank sends and receives (P-1)/P of the
 * vector, as the ring does, but with one latency instead of P-1, which is what counts for small
 * vectors. It does not pipeline the reduction with the transfers and posts 2(P-1) messages at
 * once, so it is for small vectors only (the selection table in coll.c).
 * int8 (r->q8) is this exchange's alone, since each value must be quantized once per phase: the
 * reduce-scatter quantizes chunk p for rank p, which adds the values in float32 to its own
 * unquantized chunk; the all-gather quantizes the owner's shard once and every rank, owner too,
 * takes the values of the same bytes. With r->ef each quantization keeps what it dropped there.
 */
#include <limits.h>
#include <stdlib.h>

#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "base/mpi_check.h"
#include "base/log.h"
#include "base/params.h"

typedef struct {
    int posted;                 /* 0: one rank, nothing to exchange */
    int nreq;                   /* requests, all posted at start */
    int ndone;
    dear_net_req_t *reqs;       /* 2 (P-1): receives first, then sends */
    char *slots;                /* reduce-scatter: P-1 pieces of this rank's chunk */
    float *acc;                 /* 16-bit reduce-scatter: the float32 sum of this rank's chunk */
    char *own_copy;             /* DEAR_DETERMINISTIC: room for the own piece (summed in rank order) */
    char *q8_send;              /* int8: what this rank sends, one packed chunk per peer (the
                                 * reduce-scatter) or its packed shard (the all-gather) */
    size_t *q8_at;              /* int8: offset of rank p's chunk in q8_send (RS) or slots (AG) */
} direct_state_t;

static char *elem(const dear_coll_req_t *r, const void *base, size_t index)
{
    return (char *)base + index * r->esize;
}

/* int8: every chunk this rank sends packed once (rank p's chunk of the input for p, or this
 * rank's shard for every peer), then the whole exchange posted. */
static int post_q8(dear_coll_req_t *r, direct_state_t *st)
{
    int P = r->nranks, me = r->rank, n = 0;
    int rs = r->op == DEAR_COLL_REDUCE_SCATTER;
    const float *src = (const float *)(rs ? r->src : r->buf);
    size_t mine = r->counts[me], slot = dear_q8_stride(mine);
    for (int p = 0; p < P; p++) {
        if (rs ? p == me : p != me)
            continue;
        float *e = r->ef != NULL ? r->ef + r->displs[p] : NULL;
        dear_reduce_q8_pack(st->q8_send + (rs ? st->q8_at[p] : 0), src + r->displs[p], e, r->counts[p]);
    }
    for (int i = 1; i < P; i++) {
        int p = (me + i) % P;
        void *dst = rs ? st->slots + (size_t)(i - 1) * slot : st->slots + st->q8_at[p];
        size_t len = dear_q8_bytes(rs ? mine : r->counts[p]);
        DEAR_CHECK(dear_net_irecv(r->net, dst, len, p, r->tag, &st->reqs[n++]));
    }
    for (int i = 1; i < P; i++) {
        int p = (me - i + P) % P;
        const char *from = st->q8_send + (rs ? st->q8_at[p] : 0);
        size_t len = dear_q8_bytes(rs ? r->counts[p] : mine);
        DEAR_CHECK(dear_net_isend(r->net, from, len, p, r->tag, &st->reqs[n++]));
        r->bytes_sent += len;
    }
    st->nreq = n;
    st->ndone = 0;
    return DEAR_OK;
}

/* int8, all in: a reduce-scatter's out = (own + values of the P-1 pieces) * scale in float32; an
 * all-gather's every shard, this rank's too, the values of the bytes its owner sent. */
static void finish_q8(dear_coll_req_t *r, direct_state_t *st)
{
    int P = r->nranks, me = r->rank;
    size_t mine = r->counts[me], slot = dear_q8_stride(mine);
    if (r->op == DEAR_COLL_REDUCE_SCATTER) {
        float *out = (float *)r->out;
        const float *own = (const float *)r->src + r->displs[me];
        if (own != out)
            coll_copy(r, out, own, mine * sizeof(float));
        for (int i = 1; i < P; i++)
            dear_reduce_q8_unpack(out, st->slots + (size_t)(i - 1) * slot, mine, 1);
        coll_scale(r, DEAR_FLOAT32, out, out, mine, r->scale);
        return;
    }
    float *buf = (float *)r->buf;
    for (int p = 0; p < P; p++)
        dear_reduce_q8_unpack(buf + r->displs[p], p == me ? st->q8_send : st->slots + st->q8_at[p], r->counts[p], 0);
}

/* Post the whole exchange: P-1 receives and P-1 sends. */
static int post_all(dear_coll_req_t *r, direct_state_t *st)
{
    int P = r->nranks, me = r->rank, n = 0;
    size_t mine = r->counts[me];
    int rs = r->op == DEAR_COLL_REDUCE_SCATTER;
    for (int i = 1; i < P; i++) {
        int p = (me + i) % P;   /* partners in a rotated order, so no rank is everyone's first */
        void *dst = rs ? st->slots + (size_t)(i - 1) * mine * r->esize : elem(r, r->buf, r->displs[p]);
        size_t len = rs ? mine : r->counts[p];
        DEAR_CHECK(dear_net_irecv(r->net, dst, len * r->esize, p, r->tag, &st->reqs[n++]));
    }
    for (int i = 1; i < P; i++) {
        int p = (me - i + P) % P;
        const void *src = rs ? elem(r, r->src, r->displs[p]) : elem(r, r->buf, r->displs[me]);
        size_t len = rs ? r->counts[p] : mine;
        DEAR_CHECK(dear_net_isend(r->net, src, len * r->esize, p, r->tag, &st->reqs[n++]));
        r->bytes_sent += len * r->esize;
    }
    st->nreq = n;
    st->ndone = 0;
    return DEAR_OK;
}

/* Rank p's piece of this rank's chunk: its own, or the slot it arrived in. */
static const char *piece_of_rank(const dear_coll_req_t *r, const direct_state_t *st, int p, const char *own)
{
    int i = (p - r->rank + r->nranks) % r->nranks;
    return i == 0 ? own : st->slots + (size_t)(i - 1) * r->counts[r->rank] * r->esize;
}

/* The float32 sum of this rank's chunk, scaled: into out32 when compressed, else rounded once into
 * out. */
static void acc_out(dear_coll_req_t *r, direct_state_t *st)
{
    size_t mine = r->counts[r->rank];
    if (r->out32 != NULL)
        coll_scale(r, DEAR_FLOAT32, r->out32, st->acc, mine, r->scale);
    else
        coll_narrow(r, r->dtype, r->out, st->acc, mine, r->scale);
}

/* DEAR_DETERMINISTIC: out = (((g_0 + g_1) + g_2) + ...) * scale, the ranks in order whoever owns
 * the chunk, so that a sum does not depend on where the plan put it. own is copied first when it
 * is out (in place), since out is written before own's turn comes. */
static void reduce_in_rank_order(dear_coll_req_t *r, direct_state_t *st, const char *own)
{
    size_t mine = r->counts[r->rank];
    if (own == r->out && r->rank > 0) {
        coll_copy(r, st->own_copy, own, mine * r->esize);
        own = st->own_copy;
    }
    if (st->acc != NULL) {
        coll_widen(r, r->dtype, st->acc, piece_of_rank(r, st, 0, own), mine);
        for (int p = 1; p < r->nranks; p++)
            coll_widen_acc(r, r->dtype, st->acc, piece_of_rank(r, st, p, own), mine);
        acc_out(r, st);
        return;
    }
    for (int p = 1; p < r->nranks; p++)
        coll_sum(r, r->dtype, r->out, p == 1 ? piece_of_rank(r, st, 0, own) : r->out, piece_of_rank(r, st, p, own),
                 mine, p == r->nranks - 1 ? r->scale : 1.0);
}

/* All pieces of this rank's chunk are in: out = (own + piece_1 + ... + piece_{P-1}) * scale;
 * 16-bit types add in float32 and round once. */
static void reduce_pieces(dear_coll_req_t *r, direct_state_t *st)
{
    size_t mine = r->counts[r->rank];
    const char *own = elem(r, r->src, r->displs[r->rank]);
    if (st->own_copy != NULL) {
        reduce_in_rank_order(r, st, own);
        return;
    }
    if (st->acc != NULL) {
        /* Compressed: this rank's own share never travels, so it is added unrounded. */
        if (r->src32 != NULL)
            coll_copy(r, st->acc, r->src32 + r->displs[r->rank], mine * sizeof(float));
        else
            coll_widen(r, r->dtype, st->acc, own, mine);
        for (int i = 1; i < r->nranks; i++)
            coll_widen_acc(r, r->dtype, st->acc, st->slots + (size_t)(i - 1) * mine * r->esize, mine);
        acc_out(r, st);
        return;
    }
    for (int i = 1; i < r->nranks; i++) {
        const char *piece = st->slots + (size_t)(i - 1) * mine * r->esize;
        double scale = i == r->nranks - 1 ? r->scale : 1.0;
        coll_sum(r, r->dtype, r->out, i == 1 ? own : r->out, piece, mine, scale);
    }
}

static int direct_progress(dear_coll_req_t *r, int *done)
{
    direct_state_t *st = r->state;
    if (st->posted) {
        for (int i = 0; i < st->nreq; i++) {
            if (!dear_net_active(&st->reqs[i]))
                continue;
            int flag = 0;
            DEAR_CHECK(dear_net_test(&st->reqs[i], &flag));
            if (flag) {
                st->ndone++;
                r->events++;
            }
        }
        if (st->ndone < st->nreq)
            return DEAR_OK;
        if (r->q8)
            finish_q8(r, st);
        else if (r->op == DEAR_COLL_REDUCE_SCATTER)
            reduce_pieces(r, st);
        st->posted = 0;
    }
    *done = 1;
    return DEAR_OK;
}

/* int8 buffers: a reduce-scatter's packed chunks for the peers and P - 1 slots of this rank's
 * chunk; an all-gather's packed shard and a slot per rank. */
static int start_q8(dear_coll_req_t *r, direct_state_t *st)
{
    int rc = DEAR_OK, P = r->nranks;
    int rs = r->op == DEAR_COLL_REDUCE_SCATTER;
    size_t nb = (size_t)P * sizeof(size_t), send = 0, slots = 0;
    DEAR_ALLOC_GOTO(st->q8_at, malloc(nb), nb, rc, out);
    for (int p = 0; p < P; p++) {
        st->q8_at[p] = rs ? send : slots;
        if (rs)
            send += p == r->rank ? 0 : dear_q8_stride(r->counts[p]);
        else
            slots += dear_q8_stride(r->counts[p]);
    }
    if (rs)
        slots = (size_t)(P - 1) * dear_q8_stride(r->counts[r->rank]);
    else
        send = dear_q8_stride(r->counts[r->rank]);
    DEAR_ALLOC_GOTO(st->q8_send, malloc(send + 1), send + 1, rc, out);
    DEAR_ALLOC_GOTO(st->slots, malloc(slots + 1), slots + 1, rc, out);
out:
    return rc;
}

static int direct_start(dear_coll_req_t *r)
{
    int rc = DEAR_OK;
    direct_state_t *st = NULL;
    DEAR_ALLOC_GOTO(st, calloc(1, sizeof *st), sizeof *st, rc, out);
    r->state = st;
    size_t nb = 2 * (size_t)r->nranks * sizeof(dear_net_req_t);
    DEAR_ALLOC_GOTO(st->reqs, malloc(nb), nb, rc, out);
    for (int i = 0; i < 2 * r->nranks; i++)
        st->reqs[i] = DEAR_NET_REQ_NULL;
    /* Each message is one chunk and MPI counts are ints. */
    for (int p = 0; p < r->nranks; p++) {
        if (r->q8 ? dear_q8_bytes(r->counts[p]) > INT_MAX : r->counts[p] > INT_MAX / r->esize) {
            DEAR_ERROR("coll", "direct: chunk of %zu elements exceeds one MPI message (2 GiB); use %s",
                       r->counts[p], r->q8 ? "more ranks or a 16-bit format (int8 runs direct here)" : "ring");
            return DEAR_ERR_UNSUPPORTED;
        }
    }
    if (r->nranks == 1) {
        if (r->op == DEAR_COLL_REDUCE_SCATTER)
            coll_rs_final(r, r->src, r->total);
        return DEAR_OK;  /* nothing to exchange */
    }
    if (r->q8) {
        DEAR_CHECK(start_q8(r, st));
        DEAR_CHECK(post_q8(r, st));
        st->posted = 1;
        return DEAR_OK;
    }
    if (r->op == DEAR_COLL_REDUCE_SCATTER) {
        size_t sb = (size_t)(r->nranks - 1) * r->counts[r->rank] * r->esize + 1;
        DEAR_ALLOC_GOTO(st->slots, malloc(sb), sb, rc, out);
        if (dear_dtype_is16(r->dtype)) {
            size_t ab = r->counts[r->rank] * sizeof(float) + 1;
            DEAR_ALLOC_GOTO(st->acc, malloc(ab), ab, rc, out);
        }
        if (dear_param_int(DEAR_P_DETERMINISTIC)) {
            size_t ob = r->counts[r->rank] * r->esize + 1;
            DEAR_ALLOC_GOTO(st->own_copy, malloc(ob), ob, rc, out);
        }
    }
    DEAR_CHECK(post_all(r, st));
    st->posted = 1;
out:
    return rc;
}

static void direct_each_req(dear_coll_req_t *r, dear_net_req_fn_t fn, void *arg)
{
    direct_state_t *st = r->state;
    for (int i = 0; st->reqs != NULL && i < 2 * r->nranks; i++)
        fn(&st->reqs[i], arg);
}

static void direct_cleanup(dear_coll_req_t *r)
{
    direct_state_t *st = r->state;
    if (st == NULL)
        return;
    direct_each_req(r, dear_coll_abandon_one, NULL);
    free(st->reqs);
    free(st->slots);
    free(st->acc);
    free(st->own_copy);
    free(st->q8_send);
    free(st->q8_at);
    free(st);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_direct_ops = { "direct", direct_start, direct_progress, direct_cleanup,
                                                    direct_each_req };

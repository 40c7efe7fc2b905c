/*
 * Algorithm `hier`: two levels for a communicator of H hosts x L ranks (dear_coll_topo_t).
 * Over one flat ring every host link carries (P-1)/P of the vector per phase; reducing inside
 * the host first, over shared memory, leaves (H-1)/H for the links: with 2 hosts x 2 ranks, half
 * the vector instead of three quarters.
 *
 * Rank (h, l) must end with the chunk the flat layout gives it, chunk rank_of(h, l), so the
 * result is the same whichever algorithm ran (and the runtime's all-gathers, which address the
 * shards of the flat rule, fit either). With chunk c(h', l') of rank rank_of(h', l'):
 *   reduce-scatter  1. for each host h': a reduce-scatter inside the host over the L chunks
 *                      c(h', 0..L-1), local rank l' ending with the host's sum of c(h', l');
 *                   2. a reduce-scatter across the hosts among the ranks of local index l over
 *                      the H chunks c(0..H-1, l): rank (h, l) ends with the full sum of c(h, l).
 *   all-gather      the reverse: across the hosts, then inside the host for each h'.
 *   all-reduce      composed of the two by the dispatcher, in place in the output vector.
 * Each step is an ordinary collective of this directory (ring across hosts; inside a host the
 * direct exchange up to DIRECT_INSIDE bytes, else the ring) on the topology's communicators,
 * started on the step's chunks of the caller's vector (no packing), one step after the other
 * with the caller's tag, which is unique among collectives in flight on the parent
 * communicator and so on these too. Sums are taken in another order than a flat algorithm's,
 * once per rank as always: every rank still ends with identical data.
 */
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "base/check.h"
#include "base/log.h"

/* On shared memory the direct exchange beat the ring up to 1 MiB (coll.c's table, row 0). */
#define DIRECT_INSIDE ((size_t)1 << 20)

typedef struct {
    dear_coll_op_t op;
    int cross;                  /* 1: across the hosts; 0: inside the host, for host `h` */
    int h;
} step_t;

typedef struct {
    step_t steps[2 * 64 + 2];   /* at most H intra steps per phase; H <= 64 checked at start */
    int nsteps, cur;
    dear_coll_req_t *sub;
    size_t *counts, *displs;    /* the running step's layout (max(H, L) entries) */
    char *vec;                  /* the vector the steps work on, in place */
} hier_state_t;

static int start_step(dear_coll_req_t *r, hier_state_t *st)
{
    const dear_coll_topo_t *t = r->topo;
    const step_t *s = &st->steps[st->cur];
    int n = s->cross ? t->nhosts : t->local_size, me = s->cross ? t->host : t->local;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        int owner = s->cross ? t->rank_of[i * t->local_size + t->local] : t->rank_of[s->h * t->local_size + i];
        st->counts[i] = r->counts[owner];
        st->displs[i] = r->displs[owner];
        bytes += r->counts[owner] * r->esize;
    }
    dear_coll_algo_t algo = s->cross || bytes > DIRECT_INSIDE ? DEAR_ALGO_RING : DEAR_ALGO_DIRECT;
    /* The final reduction (across the hosts) carries the scale; the host sums stay unscaled. */
    double scale = s->op == DEAR_COLL_REDUCE_SCATTER && s->cross ? r->scale : 1.0;
    char *out = st->vec + st->displs[me] * r->esize;
    if (s->op == DEAR_COLL_REDUCE_SCATTER && s->cross && r->op == DEAR_COLL_REDUCE_SCATTER)
        out = r->out; /* the caller's output: the vector itself when in place */
    return dear_coll_sub_start(r, s->op, algo, s->cross ? t->cross : t->node, me, n, st->counts, st->displs, st->vec,
                               out, scale, &st->sub);
}

static int hier_progress(dear_coll_req_t *r, int *done)
{
    hier_state_t *st = r->state;
    while (st->cur < st->nsteps) {
        int d = 0;
        size_t ev = st->sub->events;
        DEAR_CHECK(dear_coll_progress(st->sub, &d));
        r->events += st->sub->events - ev;
        if (!d)
            return DEAR_OK;
        r->bytes_sent += st->sub->bytes_sent;
        dear_coll_free(st->sub);
        st->sub = NULL;
        if (++st->cur < st->nsteps)
            DEAR_CHECK(start_step(r, st));
    }
    *done = 1;
    return DEAR_OK;
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
    int n = t->nhosts > t->local_size ? t->nhosts : t->local_size;
    DEAR_ALLOC_GOTO(st->counts, malloc(sizeof(size_t) * (size_t)n), sizeof(size_t) * (size_t)n, rc, out);
    DEAR_ALLOC_GOTO(st->displs, malloc(sizeof(size_t) * (size_t)n), sizeof(size_t) * (size_t)n, rc, out);
    /* Every step works in place on one vector: the caller's when in place (all-gathers always
     * are), the output of an all-reduce, else a scratch copy of a reduce-scatter's input. */
    switch (r->op) {
    case DEAR_COLL_REDUCE_SCATTER:
        if (r->work != NULL) {
            /* In place, or the first half of a composed all-reduce (work: its output). */
            if (r->work != r->src)
                memcpy(r->work, r->src, r->total * r->esize);
            st->vec = r->work;
        } else {
            r->scratch = dear_coll_scratch_get(r->total * r->esize, &r->scratch_bytes);
            if (r->scratch == NULL)
                return DEAR_ERR_NOMEM;
            memcpy(r->scratch, r->src, r->total * r->esize);
            st->vec = r->scratch;
        }
        break;
    default:
        st->vec = r->buf;
        break;
    }
    if (r->op != DEAR_COLL_ALLGATHER) {
        for (int h = 0; h < t->nhosts; h++)
            st->steps[st->nsteps++] = (step_t){ DEAR_COLL_REDUCE_SCATTER, 0, h };
        st->steps[st->nsteps++] = (step_t){ DEAR_COLL_REDUCE_SCATTER, 1, 0 };
    }
    if (r->op != DEAR_COLL_REDUCE_SCATTER) {
        st->steps[st->nsteps++] = (step_t){ DEAR_COLL_ALLGATHER, 1, 0 };
        for (int h = 0; h < t->nhosts; h++)
            st->steps[st->nsteps++] = (step_t){ DEAR_COLL_ALLGATHER, 0, h };
    }
    rc = start_step(r, st);
out:
    return rc;
}

static void hier_cleanup(dear_coll_req_t *r)
{
    hier_state_t *st = r->state;
    if (st == NULL)
        return;
    dear_coll_free(st->sub);
    free(st->counts);
    free(st->displs);
    free(st);
    r->state = NULL;
}

const dear_coll_algo_ops_t dear_coll_hier_ops = { "hier", hier_start, hier_progress, hier_cleanup };

/*
 * Algorithm `sparse`: block-sparse reduce-scatter and all-gather over point-to-point messages, after
 * OmniReduce (the dispatcher composes the all-reduce). The vector is cut into blocks of r->block
 * elements from element 0 (multi-block: each block from its lo, grid_build, so that rows stay
 * whole in the staging vector); a block cut by a shard boundary gives one piece to each shard, so the
 * shards are exactly the dense collectives' and the runtime can swap one for the other. Each
 * message is one shard's pieces that are not all-bits-zero (sparse) or the whole shard (dense),
 * whichever is smaller:
 *   reduce-scatter  every rank sends each owner the non-zero pieces of the owner's shard (one
 *                   exchange, as `direct`); the owner adds them to its own shard in the fixed
 *                   order own, rank+1, rank+2, ... as the messages complete, so its result is
 *                   bitwise `direct`'s (16-bit types summed in float32 and rounded once; a zero
 *                   that a skipped piece would have added is made +0, as the dense sum makes it);
 *   all-gather      every owner sends its shard's non-zero pieces (those of the union over ranks
 *                   after a reduce-scatter), packed once, to every other rank, which receives in
 *                   place and unpacks there, writing zeros for the pieces that did not travel.
 *                   On H >= 2 hosts of L >= 2 ranks (r->topo) the owner sends it to the ranks of
 *                   its host and to one partner on each other host, which passes it on, as
 *                   received, to the ranks of its host before unpacking it: each message crosses
 *                   a host's link once, not L times, as in hier (forwarding, below); it pays a
 *                   second hop inside the host.
 * Message form: a sparse message is the packed pieces, then one uint32 piece index (within the
 * shard, increasing) per piece, then the uint32 piece count; it is sent only when strictly
 * smaller than the dense shard, so the receiver tells the forms apart by the received size alone
 * (MPI_Get_count): no header on dense messages, no count exchanged ahead of each (a latency), and the
 * receive posted for the dense size serves both. The trailer comes last so that an all-gather
 * received in place unpacks in place: each piece moves up, never onto data not yet moved.
 * Zero pieces are found by one pass over the data (dear_reduce_zero_prefix), which skips a run of
 * zero pieces in one call, stops at the first non-zero bytes of a piece, and stops altogether
 * where the message would not be smaller.
 * Dense data goes by the dense algorithm: the exchange sends every shard straight to its owner,
 * and at an even P >= 4 one of its P-1 rounds pairs ranks that send to each other at once, which
 * Open MPI's TCP transport carries at about half the rate (one connection per pair), so at full
 * density it takes P/(P-1) of the ring's time or more. From DEAR_SPARSE_AGREE bytes up, every rank
 * first scans and packs all it will send and tells the others the bytes (one tiny message to
 * each peer, on the collective's tag, ahead of any data); all then take the same decision from
 * the largest: the exchange when its bytes, weighted by that round, are fewer than the ring
 * would send (with several ranks per host and hier as the dense algorithm: fewer on a host's
 * link than hier puts there, exchange_pays), else the algorithm the selection table picks for
 * the dense vector, as a sub-collective (16-bit sums still rounded once: ring and direct carry
 * float32 partial sums).
 * int8 (r->q8, float32 vectors) quantizes the values only, once per phase as `direct` does: every
 * piece that travels is packed on its own (collectives/reduce.h: its scales, then its codes, blocks
 * from the piece's start), a dense message is the whole shard packed, and the indices stay as
 * they are. The owner adds the values to its own float32 shard; in the all-gather it takes the
 * values of the bytes it sends, so that every rank holds the same bits. Its messages arrive in
 * scratch slots, not in place (values widen as they land). The exchange is always taken: its
 * dense messages are the direct exchange's, and no other algorithm quantizes once. No error
 * feedback: a residual would make every touched block travel.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll_impl.h"
#include "collectives/reduce.h"
#include "base/mpi_check.h"
#include "base/log.h"
#include "base/params.h"
#include "base/util.h"

#define IDX_BYTES sizeof(uint32_t)

/* Shard p's place in the vector and its pieces: n pieces, the first of block b0 of the vector, or
 * (a multi-block collective) starting at start[0..n) within the shard. */
typedef struct {
    size_t off, len, b0, n;
    const uint32_t *start;
} shard_t;

/* One prepared message: the dense shard itself, or packed at off in the pack buffer. */
typedef struct {
    size_t off, bytes;
    int dense;
} msg_t;

enum { FORM_AGREE, FORM_SPARSE, FORM_DENSE };

typedef struct {
    int npeers;                 /* P-1; peer i (1..P-1) is rank+i for receives (mod P) */
    dear_net_req_t *rreq, *sreq; /* npeers each, index i-1 for peer i */
    long *rbytes;               /* bytes received from peer i, -1 while pending */
    msg_t *msgs;                /* reduce-scatter: to peer i (rank-i) at i-1; all-gather: one */
    int form;                   /* FORM_*: agreeing, then the exchange or the dense algorithm */
    dear_net_req_t *areq;       /* agreement: npeers receives, then npeers sends */
    unsigned long long *abytes; /* agreement: own bytes at 0, peer i's at i */
    dear_coll_req_t *sub;       /* FORM_DENSE: the dense collective */
    size_t sub_bytes, sub_events; /* its bytes_sent and events already added to the request's */
    int next_reduce;            /* reduce-scatter: next message to add (1..P), rank order */
    char *slots;                /* reduce-scatter: npeers messages of at most the own shard */
    char *pack;                 /* packed sparse messages (scratch cache) */
    size_t pack_cap, pack_used;
    uint32_t *idx;              /* piece indices of the shard being scanned or unpacked */
    float *acc;                 /* 16-bit reduce-scatter: the float32 sums of the own shard */
    size_t *slot_at;            /* int8 all-gather: peer i's message at slots + slot_at[i - 1] */
    uint32_t *cover;            /* reduce-scatter of floats: per own piece, sparse messages with it */
    int ndense_in;              /* reduce-scatter: dense messages added */
    /* all-gather through partners (fwd_on): */
    int fwd;
    int *fwd_of;                /* per rank: its place among the owners this rank passes on, or -1 */
    int *fwd_owner, *fwd_slot;  /* those owners, ascending, and the first send slot of each */
    int nfwd, next_fwd;         /* how many; passed on so far */
    int nsends;                 /* send slots used */
    /* multi-block: every shard's piece starts, rank p's grid_at[p] .. grid_at[p + 1] - 1 of grid */
    uint32_t *grid;
    size_t *grid_at;
} sparse_state_t;

static void shard_of(const dear_coll_req_t *r, int p, shard_t *s)
{
    const sparse_state_t *st = r->state;
    s->off = r->displs[p];
    s->len = r->counts[p];
    s->b0 = s->off / r->block;
    s->n = s->len > 0 ? (s->off + s->len - 1) / r->block - s->b0 + 1 : 0;
    s->start = NULL;
    if (st != NULL && st->grid != NULL) {
        s->start = st->grid + st->grid_at[p];
        s->n = st->grid_at[p + 1] - st->grid_at[p];
    }
}

/* Piece j of shard s: *lo elements into the shard, *n elements. */
static void piece_of(const dear_coll_req_t *r, const shard_t *s, size_t j, size_t *lo, size_t *n)
{
    if (s->start != NULL) {
        *lo = s->start[j];
        *n = (j + 1 < s->n ? s->start[j + 1] : s->len) - *lo;
        return;
    }
    size_t a = (s->b0 + j) * r->block, b = a + r->block;
    a = a > s->off ? a : s->off;
    b = b < s->off + s->len ? b : s->off + s->len;
    *lo = a - s->off;
    *n = b - a;
}

/* The piece of shard s holding element e (within the shard), or s->n past its end. */
static size_t piece_at(const dear_coll_req_t *r, const shard_t *s, size_t e)
{
    if (e >= s->len)
        return s->n;
    if (s->start == NULL)
        return (s->off + e) / r->block - s->b0;
    size_t a = 0, b = s->n; /* the last start at or before e */
    while (b - a > 1) {
        size_t m = a + (b - a) / 2;
        *(s->start[m] <= e ? &a : &b) = m;
    }
    return a;
}

/* Bytes of n elements as they travel: packed under int8, else as they are. */
static size_t wire_bytes(const dear_coll_req_t *r, size_t n) { return r->q8 ? dear_q8_bytes(n) : n * r->esize; }

/* Element index (within shard s) of the first element at or after lo that is not all-bits-zero,
 * or s->len. */
static size_t next_nonzero(const dear_coll_req_t *r, const shard_t *s, const char *shard, size_t lo)
{
    return lo + dear_reduce_zero_prefix(shard + lo * r->esize, (s->len - lo) * r->esize) / r->esize;
}

/* The non-zero pieces of shard s (data at shard) into idx[0..*k); returns the sparse message's
 * size, or 0 when it would be no smaller than the dense shard (the scan stops there). Runs of
 * zero pieces are skipped in one call, so small blocks cost no call each. */
static size_t scan_shard(const dear_coll_req_t *r, const shard_t *s, const char *shard, uint32_t *idx, size_t *k)
{
    size_t dense = wire_bytes(r, s->len), bytes = IDX_BYTES;
    *k = 0;
    for (size_t j = 0; j < s->n && bytes < dense;) {
        size_t lo, n;
        piece_of(r, s, j, &lo, &n);
        size_t nz = next_nonzero(r, s, shard, lo);
        if (nz >= lo + n) {
            j = piece_at(r, s, nz);
            continue;
        }
        bytes += wire_bytes(r, n) + IDX_BYTES;
        idx[(*k)++] = (uint32_t)j++;
    }
    return bytes < dense ? bytes : 0;
}

static void pack_shard(const dear_coll_req_t *r, const shard_t *s, const char *shard, const uint32_t *idx,
                       size_t k, char *dst)
{
    for (size_t i = 0; i < k; i++) {
        size_t lo, n;
        piece_of(r, s, idx[i], &lo, &n);
        if (r->q8)
            dear_reduce_q8_pack(dst, (const float *)(shard + lo * r->esize), NULL, n);
        else
            memcpy(dst, shard + lo * r->esize, n * r->esize);
        dst += wire_bytes(r, n);
    }
    uint32_t k32 = (uint32_t)k;
    memcpy(dst, idx, k * IDX_BYTES);
    memcpy(dst + k * IDX_BYTES, &k32, IDX_BYTES);
}

/* A sparse message of m bytes from rank `from` for shard s: its indices into idx[0..*k) after
 * checking them (increasing, within the shard) and the size they imply; *payload is the bytes of
 * pieces. A malformed one means the ranks disagree on count, block or type. */
static int parse_msg(const dear_coll_req_t *r, const shard_t *s, const char *msg, size_t m, int from,
                     uint32_t *idx, size_t *k, size_t *payload)
{
    uint32_t k32 = 0;
    size_t bytes = 0;
    int ok = m >= IDX_BYTES;
    if (ok) {
        memcpy(&k32, msg + m - IDX_BYTES, IDX_BYTES);
        ok = k32 <= s->n && ((size_t)k32 + 1) * IDX_BYTES <= m;
    }
    if (ok) {
        memcpy(idx, msg + m - ((size_t)k32 + 1) * IDX_BYTES, k32 * IDX_BYTES);
        for (size_t i = 0; i < k32 && ok; i++) {
            size_t lo, n;
            ok = idx[i] < s->n && (i == 0 || idx[i] > idx[i - 1]);
            if (ok) {
                piece_of(r, s, idx[i], &lo, &n);
                bytes += wire_bytes(r, n);
            }
        }
        ok = ok && bytes + ((size_t)k32 + 1) * IDX_BYTES == m;
    }
    if (!ok) {
        DEAR_ERROR("coll", "sparse: malformed message of %zu bytes from rank %d for a shard of %zu elements "
                           "(do all ranks pass the same count, sparse_block and dtype?)", m, from, s->len);
        return DEAR_ERR_MISMATCH;
    }
    *k = k32;
    *payload = bytes;
    return DEAR_OK;
}

/* Test the outstanding receives (recording their sizes) and sends; *busy when any is left. */
static int test_all(dear_coll_req_t *r, sparse_state_t *st, int *busy)
{
    *busy = 0;
    for (int i = 0; i < st->npeers; i++) {
        int flag;
        if (dear_net_active(&st->rreq[i])) {
            size_t n = 0;
            DEAR_CHECK(dear_net_test_recv(&st->rreq[i], &flag, &n));
            if (flag) {
                st->rbytes[i] = (long)n;
                r->events++;
            }
            *busy |= !flag;
        }
        if (dear_net_active(&st->sreq[i])) {
            DEAR_CHECK(dear_net_test(&st->sreq[i], &flag));
            r->events += (size_t)flag;
            *busy |= !flag;
        }
    }
    return DEAR_OK;
}

/* Shard s (at shard) as a message: packed at the end of the pack buffer when sparse is smaller,
 * else the shard itself (int8: the shard packed there). */
static void prepare_msg(const dear_coll_req_t *r, sparse_state_t *st, const shard_t *s, const char *shard, msg_t *m)
{
    size_t k, bytes = scan_shard(r, s, shard, st->idx, &k);
    m->dense = bytes == 0;
    m->bytes = m->dense ? wire_bytes(r, s->len) : bytes;
    m->off = st->pack_used;
    if (!m->dense)
        pack_shard(r, s, shard, st->idx, k, st->pack + st->pack_used);
    else if (r->q8)
        dear_reduce_q8_pack(st->pack + st->pack_used, (const float *)shard, NULL, s->len);
    if (!m->dense || r->q8)
        st->pack_used += m->bytes;
}

/* The pack buffer's bytes for the messages a phase sends: every other rank's shard (a
 * reduce-scatter) or the own one (an all-gather), each at its dense size on the wire, which bounds
 * its sparse message. */
static size_t pack_bound(const dear_coll_req_t *r, int others)
{
    size_t b = 0;
    for (int p = 0; p < r->nranks; p++)
        b += (p != r->rank) == others ? wire_bytes(r, r->counts[p]) : 0;
    return b;
}

/* int8: the values of message msg (m bytes) for shard s into the float32 shard at base: a dense
 * one's every element, a sparse one's pieces, zeros between them. */
static int q8_unpack_msg(const dear_coll_req_t *r, sparse_state_t *st, const shard_t *s, const char *msg, size_t m,
                         int from, float *base)
{
    if (m == wire_bytes(r, s->len)) {
        dear_reduce_q8_unpack(base, msg, s->len, 0);
        return DEAR_OK;
    }
    size_t k, payload;
    DEAR_CHECK(parse_msg(r, s, msg, m, from, st->idx, &k, &payload));
    memset(base, 0, s->len * sizeof(float));
    for (size_t j = 0; j < k; j++) {
        size_t lo, n;
        piece_of(r, s, st->idx[j], &lo, &n);
        dear_reduce_q8_unpack(base + lo, msg, n, 0);
        msg += wire_bytes(r, n);
    }
    return DEAR_OK;
}

/* Send m's bytes at data to rank `to` in send slot `slot`, counted by form. */
static int post_send(dear_coll_req_t *r, sparse_state_t *st, const char *data, const msg_t *m, int to, int slot)
{
    DEAR_CHECK(dear_net_isend(r->net, data, m->bytes, to, r->tag, &st->sreq[slot]));
    r->bytes_sent += m->bytes;
    if (m->dense)
        r->msgs_dense++;
    else
        r->msgs_sparse++;
    return DEAR_OK;
}

/* Where prepared message m's bytes lie: the dense shard itself, else the pack buffer. */
static const char *msg_data(const dear_coll_req_t *r, const sparse_state_t *st, const msg_t *m, const char *shard)
{
    return m->dense && !r->q8 ? shard : st->pack + m->off;
}

/* Send m (shard: the dense shard it stands for) to peer i, rank-i (mod P). */
static int send_msg(dear_coll_req_t *r, sparse_state_t *st, const msg_t *m, const char *shard, int i)
{
    return post_send(r, st, msg_data(r, st, m, shard), m, (r->rank - i + r->nranks) % r->nranks, i - 1);
}

/* ---- reduce-scatter: peer i sends to rank-i and receives from rank+i (mod P) ---- */

/* Every peer's message, scanned and packed; *bytes their sum (an empty shard sends nothing). */
static int rs_prepare(dear_coll_req_t *r, sparse_state_t *st, unsigned long long *bytes)
{
    shard_t own;
    shard_of(r, r->rank, &own);
    /* Sparse messages are smaller than their shards, so the other shards' bytes bound them all. */
    st->pack = dear_coll_scratch_get(pack_bound(r, 1), &st->pack_cap);
    if (st->pack == NULL)
        return DEAR_ERR_NOMEM;
    *bytes = 0;
    for (int i = 1; i <= st->npeers; i++) {
        shard_t s;
        shard_of(r, (r->rank - i + r->nranks) % r->nranks, &s);
        if (s.len > 0)
            prepare_msg(r, st, &s, r->src + s.off * r->esize, &st->msgs[i - 1]);
        *bytes += st->msgs[i - 1].bytes;
    }
    return DEAR_OK;
}

/* Add message i (from rank+i) to the own shard: dense as one vector, sparse piece by piece. */
static int rs_reduce(dear_coll_req_t *r, sparse_state_t *st, int i)
{
    shard_t s;
    shard_of(r, r->rank, &s);
    size_t m = (size_t)st->rbytes[i - 1];
    const char *msg = st->slots + (size_t)(i - 1) * wire_bytes(r, s.len);
    if (s.len == 0)
        return DEAR_OK;
    if (m == wire_bytes(r, s.len)) {
        if (r->q8)
            dear_reduce_q8_unpack((float *)r->out, msg, s.len, 1);
        else if (st->acc != NULL)
            coll_widen_acc(r, r->dtype, st->acc, msg, s.len);
        else
            coll_sum(r, r->dtype, r->out, r->out, msg, s.len, 1.0);
        st->ndense_in++;
        return DEAR_OK;
    }
    size_t k, payload;
    DEAR_CHECK(parse_msg(r, &s, msg, m, (r->rank + i) % r->nranks, st->idx, &k, &payload));
    for (size_t j = 0; j < k; j++) {
        size_t lo, n;
        piece_of(r, &s, st->idx[j], &lo, &n);
        if (r->q8)
            dear_reduce_q8_unpack((float *)r->out + lo, msg, n, 1);
        else if (st->acc != NULL)
            coll_widen_acc(r, r->dtype, st->acc + lo, msg, n);
        else
            coll_sum(r, r->dtype, r->out + lo * r->esize, r->out + lo * r->esize, msg, n, 1.0);
        if (st->cover != NULL)
            st->cover[st->idx[j]]++;
        msg += wire_bytes(r, n);
    }
    return DEAR_OK;
}

/* All messages added: the dense sum would have added +0 for every piece a rank skipped, which
 * turns a -0 sum into +0, so do the same there; then scale (16-bit: round once). */
static void rs_finish(dear_coll_req_t *r, sparse_state_t *st)
{
    shard_t s;
    shard_of(r, r->rank, &s);
    dear_dtype_t sum_type = st->acc != NULL ? DEAR_FLOAT32 : r->dtype;
    char *sum = st->acc != NULL ? (char *)st->acc : r->out;
    size_t sum_es = st->acc != NULL ? sizeof(float) : r->esize;
    for (size_t j = 0; st->cover != NULL && j < s.n; j++) {
        if ((int)st->cover[j] + st->ndense_in == st->npeers)
            continue;
        size_t lo, n;
        piece_of(r, &s, j, &lo, &n);
        dear_reduce_zero_sign(sum_type, sum + lo * sum_es, n);
    }
    if (r->out32 != NULL)
        coll_scale(r, DEAR_FLOAT32, r->out32, st->acc, s.len, r->scale);
    else if (st->acc != NULL)
        coll_narrow(r, r->dtype, r->out, st->acc, s.len, r->scale);
    else
        coll_scale(r, r->dtype, r->out, r->out, s.len, r->scale);
}

static int rs_start(dear_coll_req_t *r, sparse_state_t *st)
{
    int rc = DEAR_OK;
    shard_t s;
    shard_of(r, r->rank, &s);
    const char *own = r->src + s.off * r->esize;
    if (dear_dtype_is16(r->dtype)) {
        size_t ab = s.len * sizeof(float) + 1;
        DEAR_ALLOC_GOTO(st->acc, malloc(ab), ab, rc, out);
        if (r->src32 != NULL) /* compressed: the own share never travels, added unrounded */
            coll_copy(r, st->acc, r->src32 + s.off, s.len * sizeof(float));
        else
            coll_widen(r, r->dtype, st->acc, own, s.len);
    } else if (r->out != own) {
        coll_copy(r, r->out, own, s.len * r->esize);
    }
    if (r->dtype != DEAR_INT32) {
        size_t cb = s.n * sizeof(uint32_t) + 1;
        DEAR_ALLOC_GOTO(st->cover, calloc(1, cb), cb, rc, out);
    }
    size_t slot = wire_bytes(r, s.len), sb = (size_t)st->npeers * slot + 1;
    DEAR_ALLOC_GOTO(st->slots, malloc(sb), sb, rc, out);
    for (int i = 1; i <= st->npeers; i++) {
        int p = (r->rank + i) % r->nranks;
        st->rbytes[i - 1] = 0;
        if (s.len == 0)
            continue;  /* an empty shard: nobody sends */
        st->rbytes[i - 1] = -1;
        DEAR_CHECK(dear_net_irecv(r->net, st->slots + (size_t)(i - 1) * slot, slot, p, r->tag, &st->rreq[i - 1]));
    }
    st->next_reduce = 1;
    for (int i = 1; i <= st->npeers; i++) {
        shard_t ps;
        shard_of(r, (r->rank - i + r->nranks) % r->nranks, &ps);
        if (ps.len > 0)
            DEAR_CHECK(send_msg(r, st, &st->msgs[i - 1], r->src + ps.off * r->esize, i));
    }
out:
    return rc;
}

static int rs_progress(dear_coll_req_t *r, sparse_state_t *st, int *done)
{
    int busy;
    DEAR_CHECK(test_all(r, st, &busy));
    while (st->next_reduce <= st->npeers && st->rbytes[st->next_reduce - 1] >= 0) {
        DEAR_CHECK(rs_reduce(r, st, st->next_reduce));
        st->next_reduce++;
    }
    if (busy || st->next_reduce <= st->npeers)
        return DEAR_OK;
    rs_finish(r, st);
    *done = 1;
    return DEAR_OK;
}

/* ---- all-gather: in place on buf; rank+i's shard comes from rank+i, ours goes to all ---- */

/* Rank p's shard arrived as a sparse message of m bytes at its start: move each piece up to its
 * place, last first (a piece's place is never below its packed position, so nothing not yet
 * moved is overwritten; the indices are copied out first), and zero what lies between. */
static int ag_unpack(dear_coll_req_t *r, sparse_state_t *st, int p, size_t m)
{
    shard_t s;
    shard_of(r, p, &s);
    char *base = r->buf + s.off * r->esize;
    size_t k, payload;
    DEAR_CHECK(parse_msg(r, &s, base, m, p, st->idx, &k, &payload));
    size_t src = payload, end = s.len * r->esize;
    for (size_t j = k; j-- > 0;) {
        size_t lo, n;
        piece_of(r, &s, st->idx[j], &lo, &n);
        src -= n * r->esize;
        memmove(base + lo * r->esize, base + src, n * r->esize);
        memset(base + (lo + n) * r->esize, 0, end - (lo + n) * r->esize);
        end = lo * r->esize;
    }
    memset(base, 0, end);
    return DEAR_OK;
}

/* The own shard's message, the same for every peer; *bytes all it sends. */
static int ag_prepare(dear_coll_req_t *r, sparse_state_t *st, unsigned long long *bytes)
{
    shard_t s;
    shard_of(r, r->rank, &s);
    *bytes = 0;
    if (s.len == 0)
        return DEAR_OK;
    st->pack = dear_coll_scratch_get(pack_bound(r, 0), &st->pack_cap);
    if (st->pack == NULL)
        return DEAR_ERR_NOMEM;
    prepare_msg(r, st, &s, r->buf + s.off * r->esize, &st->msgs[0]);
    *bytes = (unsigned long long)st->msgs[0].bytes * (unsigned long long)st->npeers;
    /* int8: the owner holds what the others will, the values of the bytes it sends */
    if (r->q8)
        return q8_unpack_msg(r, st, &s, st->pack + st->msgs[0].off, st->msgs[0].bytes, r->rank,
                             (float *)(r->buf + s.off * r->esize));
    return DEAR_OK;
}

/* ---- all-gather through partners: each message crosses a host's link once ---- */

static int fwd_on(const dear_coll_req_t *r)
{
    return r->topo != NULL && r->topo->nhosts >= 2 && r->topo->local_size >= 2;
}

/* The rank of host h that receives rank o's message across the link and passes it on: o's local
 * index from a lower host, the one below it (mod L) from a higher host, so that no connection
 * carries both directions (Open MPI's TCP carries such a pair at about half the rate; coll_hier.c
 * pairs its two hosts alike). */
static int partner(const dear_coll_req_t *r, int o, int h)
{
    const dear_coll_topo_t *t = r->topo;
    int L = t->local_size, l = t->local_of[o];
    return t->rank_of[h * L + (h > t->host_of[o] ? (l + L - 1) % L : l)];
}

/* Whom this rank receives rank p's message from: p on this host or where this rank is p's
 * partner, else p's partner here. */
static int source_of(const dear_coll_req_t *r, int p)
{
    if (r->topo->host_of[p] == r->topo->host)
        return p;
    int q = partner(r, p, r->topo->host);
    return q == r->rank ? p : q;
}

/* The owners this rank passes on (one per other host), ascending: the order it passes them on
 * in, and its host's ranks receive them in. */
static int fwd_setup(dear_coll_req_t *r, sparse_state_t *st)
{
    const dear_coll_topo_t *t = r->topo;
    int rc = DEAR_OK;
    size_t pb = (size_t)r->nranks * sizeof(int);
    DEAR_ALLOC_GOTO(st->fwd_of, malloc(pb), pb, rc, out);
    DEAR_ALLOC_GOTO(st->fwd_owner, malloc(pb), pb, rc, out);
    DEAR_ALLOC_GOTO(st->fwd_slot, malloc(pb), pb, rc, out);
    for (int p = 0; p < r->nranks; p++) {
        st->fwd_of[p] = -1;
        if (t->host_of[p] != t->host && partner(r, p, t->host) == r->rank)
            st->fwd_of[p] = st->nfwd, st->fwd_owner[st->nfwd++] = p;
    }
    st->fwd = 1;
out:
    return rc;
}

/* Pass on, as they arrive and in ascending order of owner, the messages this rank receives for
 * its host: to every other rank of the host, as received (their size tells their form). */
static int fwd_pass(dear_coll_req_t *r, sparse_state_t *st)
{
    const dear_coll_topo_t *t = r->topo;
    for (; st->next_fwd < st->nfwd; st->next_fwd++) {
        int p = st->fwd_owner[st->next_fwd], i = (p - r->rank + r->nranks) % r->nranks;
        if (st->rbytes[i - 1] < 0)
            return DEAR_OK;
        st->fwd_slot[st->next_fwd] = st->nsends;
        if (r->counts[p] == 0)
            continue;
        msg_t m = { 0, (size_t)st->rbytes[i - 1], 0 };
        m.dense = m.bytes == wire_bytes(r, r->counts[p]);
        const char *data = r->q8 ? st->slots + st->slot_at[i - 1] : r->buf + r->displs[p] * r->esize;
        for (int l = 0; l < t->local_size; l++)
            if (l != t->local)
                DEAR_CHECK(post_send(r, st, data, &m, t->rank_of[t->host * t->local_size + l], st->nsends++));
    }
    return DEAR_OK;
}

/* Whether rank p's message, which this rank passes on, has left: until then it stays as it
 * arrived (unpacking moves it in place). */
static int fwd_left(const dear_coll_req_t *r, sparse_state_t *st, int p)
{
    int k = st->fwd_of[p];
    if (k >= st->next_fwd)
        return 0;
    int n = r->counts[p] > 0 ? r->topo->local_size - 1 : 0;
    for (int j = st->fwd_slot[k]; j < st->fwd_slot[k] + n; j++)
        if (dear_net_active(&st->sreq[j]))
            return 0;
    return 1;
}

/* Post the receive of rank p's message from rank src. */
static int ag_recv(dear_coll_req_t *r, sparse_state_t *st, int p, int src)
{
    int i = (p - r->rank + r->nranks) % r->nranks;
    st->rbytes[i - 1] = 0;
    if (r->counts[p] == 0)
        return DEAR_OK;
    st->rbytes[i - 1] = -1;
    char *into = r->q8 ? st->slots + st->slot_at[i - 1] : r->buf + r->displs[p] * r->esize;
    return dear_net_irecv(r->net, into, wire_bytes(r, r->counts[p]), src, r->tag, &st->rreq[i - 1]);
}

static int ag_start(dear_coll_req_t *r, sparse_state_t *st)
{
    int rc = DEAR_OK;
    shard_t s;
    shard_of(r, r->rank, &s);
    if (r->q8) { /* the messages land in slots, widened into place as they complete */
        size_t nb = (size_t)st->npeers * sizeof(size_t), at = 0;
        DEAR_ALLOC_GOTO(st->slot_at, malloc(nb), nb, rc, out);
        for (int i = 1; i <= st->npeers; i++) {
            st->slot_at[i - 1] = at;
            at += wire_bytes(r, r->counts[(r->rank + i) % r->nranks]);
        }
        DEAR_ALLOC_GOTO(st->slots, malloc(at + 1), at + 1, rc, out);
    }
    /* A source's messages match in the order it sends them: its own first, then (through
     * partners) those it passes on, ascending. */
    for (int i = 1; i <= st->npeers; i++) {
        int p = (r->rank + i) % r->nranks;
        if (!st->fwd || source_of(r, p) == p)
            DEAR_CHECK(ag_recv(r, st, p, p));
    }
    for (int p = 0; st->fwd && p < r->nranks; p++) {
        int src = p != r->rank ? source_of(r, p) : p;
        if (src != p)
            DEAR_CHECK(ag_recv(r, st, p, src));
    }
    if (s.len == 0)
        goto out;
    if (!st->fwd) {
        for (int i = 1; i <= st->npeers; i++)
            DEAR_CHECK(send_msg(r, st, &st->msgs[0], r->buf + s.off * r->esize, i));
        goto out;
    }
    const char *data = msg_data(r, st, &st->msgs[0], r->buf + s.off * r->esize);
    const dear_coll_topo_t *t = r->topo;
    for (int p = 0; p < r->nranks; p++)  /* the host's ranks and one partner on each other host */
        if (p != r->rank && (t->host_of[p] == t->host || partner(r, r->rank, t->host_of[p]) == p))
            DEAR_CHECK(post_send(r, st, data, &st->msgs[0], p, st->nsends++));
out:
    return rc;
}

static int ag_progress(dear_coll_req_t *r, sparse_state_t *st, int *done)
{
    int busy;
    DEAR_CHECK(test_all(r, st, &busy));
    if (st->fwd)
        DEAR_CHECK(fwd_pass(r, st));
    int held = st->next_fwd < st->nfwd;
    for (int i = 1; i <= st->npeers; i++) {
        int p = (r->rank + i) % r->nranks;
        long m = st->rbytes[i - 1];
        if (m >= 0 && st->fwd && st->fwd_of[p] >= 0 && !fwd_left(r, st, p)) {
            held = 1;
        } else if (m >= 0 && r->q8 && r->counts[p] > 0) {
            shard_t ps;
            shard_of(r, p, &ps);
            DEAR_CHECK(q8_unpack_msg(r, st, &ps, st->slots + st->slot_at[i - 1], (size_t)m, p,
                                     (float *)(r->buf + ps.off * r->esize)));
            st->rbytes[i - 1] = -2; /* widened into place */
        } else if (m >= 0 && (size_t)m < r->counts[p] * r->esize) {
            DEAR_CHECK(ag_unpack(r, st, p, (size_t)m));
            st->rbytes[i - 1] = (long)(r->counts[p] * r->esize); /* in place now: as if dense */
        }
    }
    *done = !busy && !held;
    return DEAR_OK;
}

/* ---- choosing the form: every rank's bytes, one decision ---- */

/* The dense algorithm that replaces the exchange: the selection table's for the dense vector,
 * unless it cannot run here as it is (no block, no MPI collective, 16-bit sums exact): ring. */
static dear_coll_algo_t dense_algo(dear_coll_op_t op, dear_dtype_t dtype, size_t bytes, int nranks,
                                   const dear_coll_topo_t *topo)
{
    dear_coll_algo_t algo = dear_coll_select(op, bytes, nranks, topo);
    int exact16 = !dear_dtype_is16(dtype) || op == DEAR_COLL_ALLGATHER ||
                  (dear_coll_algo_flags(algo) & DEAR_ALGO_F_EXACT16);
    return algo == DEAR_ALGO_SPARSE || algo == DEAR_ALGO_MPI || !exact16 ? DEAR_ALGO_RING : algo;
}

int dear_coll_sparse_copies(dear_coll_op_t op, dear_dtype_t dtype, size_t bytes, int nranks,
                            const dear_coll_topo_t *topo)
{
    if (op == DEAR_COLL_ALLGATHER || topo == NULL || topo->local_size < 2 || topo->nhosts < 2 ||
        dense_algo(op, dtype, bytes, nranks, topo) != DEAR_ALGO_HIER)
        return 1;
    return topo->local_size;
}

/* The exchange, or the dense algorithm when the exchange would not be faster. The exchange's
 * cost is the largest bytes any rank sends, times P/(P-1) at an even P >= 4 (the round of ranks
 * sending to each other). Against a flat dense algorithm it is weighed against the bytes the
 * ring sends per rank, (P-1)/P of the vector at the least. Against hier, on H hosts of L ranks,
 * both are counted on a host's link, which bounds them: hier sends (H-1)/H of the vector across
 * once combined inside the host, while the reduce-scatter's exchange sends every rank's pieces
 * straight to the P-L ranks elsewhere, L ranks' worth, (P-L)/(P-1) of each rank's bytes if spread
 * evenly; the all-gather's goes through partners. */
static int exchange_pays(const dear_coll_req_t *r, unsigned long long most)
{
    int P = r->nranks, even = P >= 4 && P % 2 == 0;
    /* Through partners each of a host's L owners sends one message, at most most/(P-1) bytes,
     * across to each of the H-1 other hosts, where hier sends (H-1)/H of the vector: no round of
     * ranks sending to each other. */
    if (r->op == DEAR_COLL_ALLGATHER && fwd_on(r))
        return (double)most * P / (P - 1) < (double)r->total * (double)r->esize;
    int L = dear_coll_sparse_copies(r->op, r->dtype, r->total * r->esize, P, r->topo);
    if (L > 1) {
        int H = r->topo->nhosts;
        double x = (double)most * (even ? (double)P / (P - 1) : 1.0) * L * (P - L) / (P - 1);
        return x < (double)r->total * (double)r->esize * (H - 1) / H;
    }
    size_t biggest = 0;
    for (int p = 0; p < P; p++)
        biggest = r->counts[p] > biggest ? r->counts[p] : biggest;
    unsigned long long ring = (unsigned long long)(r->total - biggest) * r->esize;
    if (even)
        return most * (unsigned long long)P < ring * (unsigned long long)(P - 1);
    return most < ring;
}

/* Tell every peer this rank's bytes (abytes[0]) and post the receives of theirs. The receives
 * come first on the tag, so they match the peers' first messages, never their data. */
static int agree_start(dear_coll_req_t *r, sparse_state_t *st)
{
    int rc = DEAR_OK;
    size_t nb = 2 * (size_t)st->npeers * sizeof(dear_net_req_t);
    DEAR_ALLOC_GOTO(st->areq, malloc(nb), nb, rc, out);
    for (int i = 0; i < 2 * st->npeers; i++)
        st->areq[i] = DEAR_NET_REQ_NULL;
    for (int i = 1; i <= st->npeers; i++)
        DEAR_CHECK(dear_net_irecv(r->net, &st->abytes[i], sizeof st->abytes[i], (r->rank + i) % r->nranks, r->tag,
                                  &st->areq[i - 1]));
    for (int i = 1; i <= st->npeers; i++)
        DEAR_CHECK(dear_net_isend(r->net, &st->abytes[0], sizeof st->abytes[0], (r->rank - i + r->nranks) % r->nranks,
                                  r->tag, &st->areq[st->npeers + i - 1]));
out:
    return rc;
}

/* The dense algorithm in the exchange's place, on the same vectors. */
static int dense_start(dear_coll_req_t *r, sparse_state_t *st)
{
    dear_coll_algo_t algo = dense_algo(r->op, r->dtype, r->total * r->esize, r->nranks, r->topo);
    int rs = r->op == DEAR_COLL_REDUCE_SCATTER;
    return dear_coll_sub_start32(r, r->op, algo, r->net, r->rank, r->nranks, r->counts, r->displs,
                                 rs ? r->src : r->buf, rs ? r->src32 : NULL, rs ? r->work : r->buf,
                                 rs ? r->out : NULL, rs ? r->out32 : NULL, r->scale, 0, &st->sub);
}

static int form_progress(dear_coll_req_t *r, sparse_state_t *st)
{
    int flag;
    DEAR_CHECK(dear_net_testall(2 * st->npeers, st->areq, &flag));
    if (!flag)
        return DEAR_OK;
    r->events++;
    unsigned long long most = 0;
    for (int i = 0; i <= st->npeers; i++)
        most = st->abytes[i] > most ? st->abytes[i] : most;
    st->form = exchange_pays(r, most) ? FORM_SPARSE : FORM_DENSE;
    DEAR_DEBUG("coll", "sparse: %s %zu elements: at most %llu bytes from a rank, %s", dear_coll_op_short(r->op),
               r->total, most, st->form == FORM_SPARSE ? "the exchange" : "dense");
    if (st->form == FORM_DENSE)
        return dense_start(r, st);
    return r->op == DEAR_COLL_REDUCE_SCATTER ? rs_start(r, st) : ag_start(r, st);
}

/* ---- the algorithm's entry points ---- */

static int sparse_progress(dear_coll_req_t *r, int *done)
{
    sparse_state_t *st = r->state;
    if (st->npeers == 0) {
        *done = 1;
        return DEAR_OK;
    }
    if (st->form == FORM_AGREE) {
        DEAR_CHECK(form_progress(r, st));
        if (st->form == FORM_AGREE)
            return DEAR_OK;
    }
    if (st->form == FORM_DENSE) {
        int rc = dear_coll_progress(st->sub, done);
        r->bytes_sent += st->sub->bytes_sent - st->sub_bytes;  /* counted since the last call */
        r->events += st->sub->events - st->sub_events;
        st->sub_bytes = st->sub->bytes_sent;
        st->sub_events = st->sub->events;
        return rc;
    }
    return r->op == DEAR_COLL_REDUCE_SCATTER ? rs_progress(r, st, done) : ag_progress(r, st, done);
}

typedef struct {
    size_t block, base, k;
    uint32_t *out;              /* NULL: count only */
} grid_arg_t;

/* A rank's piece [at, at + n) of block b, at pos of the staging vector: cut where a run of
 * `block` elements from the block's lo ends, each start recorded within the rank's shard. */
static int grid_piece(void *arg, const dear_coll_block_t *b, size_t at, size_t n, size_t pos)
{
    grid_arg_t *g = arg;
    for (size_t x = at; x < at + n; x = b->lo + ((x - b->lo) / g->block + 1) * g->block) {
        if (g->out != NULL)
            g->out[g->k] = (uint32_t)(pos - g->base + (x - at));
        g->k++;
    }
    return 0;
}

/* A multi-block collective cuts each block from its own lo, so that its rows stay whole in the
 * staging vector (a grid over the concatenation would cut every row that a shard's start leaves
 * out of step, sending it as two pieces). */
static int grid_build(dear_coll_req_t *r, sparse_state_t *st)
{
    int rc = DEAR_OK;
    grid_arg_t g = { r->block, 0, 0, NULL };
    (void)dear_coll_blocks_each(r->blocks, r->nblocks, r->nranks, r->displs, 0, r->nranks, grid_piece, &g);
    size_t gb = (g.k + 1) * sizeof(uint32_t), ab = ((size_t)r->nranks + 1) * sizeof(size_t);
    DEAR_ALLOC_GOTO(st->grid, malloc(gb), gb, rc, out);
    DEAR_ALLOC_GOTO(st->grid_at, malloc(ab), ab, rc, out);
    g.out = st->grid;
    g.k = 0;
    for (int p = 0; p < r->nranks; p++) {
        st->grid_at[p] = g.k;
        g.base = r->displs[p];
        (void)dear_coll_blocks_each(r->blocks, r->nblocks, r->nranks, r->displs, p, p + 1, grid_piece, &g);
    }
    st->grid_at[r->nranks] = g.k;
out:
    return rc;
}

static int sparse_start(dear_coll_req_t *r)
{
    int rc = DEAR_OK;
    sparse_state_t *st = NULL;
    DEAR_ALLOC_GOTO(st, calloc(1, sizeof *st), sizeof *st, rc, out);
    r->state = st;
    if (r->nranks == 1) {
        if (r->op == DEAR_COLL_REDUCE_SCATTER)
            coll_rs_final(r, r->src, r->total);
        return DEAR_OK;  /* nothing travels */
    }
    st->npeers = r->nranks - 1;
    size_t nb = (size_t)st->npeers * sizeof(dear_net_req_t), lb = (size_t)st->npeers * sizeof(long);
    size_t mb = (size_t)st->npeers * sizeof(msg_t), ab = ((size_t)st->npeers + 1) * sizeof(unsigned long long);
    DEAR_ALLOC_GOTO(st->rreq, malloc(nb), nb, rc, out);
    DEAR_ALLOC_GOTO(st->sreq, malloc(nb), nb, rc, out);
    DEAR_ALLOC_GOTO(st->rbytes, malloc(lb), lb, rc, out);
    DEAR_ALLOC_GOTO(st->msgs, calloc(1, mb), mb, rc, out);
    DEAR_ALLOC_GOTO(st->abytes, calloc(1, ab), ab, rc, out);
    for (int i = 0; i < st->npeers; i++)
        st->rreq[i] = st->sreq[i] = DEAR_NET_REQ_NULL;
    if (r->blocks != NULL)
        DEAR_CHECK_GOTO(grid_build(r, st), rc, out);
    /* Each message is at most one shard and MPI counts are ints (the grid's uint32 starts too). */
    size_t max_pieces = 0;
    for (int p = 0; p < r->nranks; p++) {
        if (r->counts[p] > INT_MAX / r->esize || wire_bytes(r, r->counts[p]) > INT_MAX) {
            DEAR_ERROR("coll", "sparse: shard of %zu elements exceeds one MPI message (2 GiB); use ring",
                       r->counts[p]);
            return DEAR_ERR_UNSUPPORTED;
        }
        shard_t s;
        shard_of(r, p, &s);
        max_pieces = s.n > max_pieces ? s.n : max_pieces;
    }
    size_t ib = max_pieces * sizeof(uint32_t) + 1;
    DEAR_ALLOC_GOTO(st->idx, malloc(ib), ib, rc, out);
    int rs = r->op == DEAR_COLL_REDUCE_SCATTER;
    if (!rs && fwd_on(r))
        DEAR_CHECK_GOTO(fwd_setup(r, st), rc, out);
    DEAR_CHECK_GOTO(rs ? rs_prepare(r, st, &st->abytes[0]) : ag_prepare(r, st, &st->abytes[0]), rc, out);
    /* One tiny message per peer first: a latency, small against large vectors' transfer. */
    if (!r->q8 && r->total * r->esize >= (size_t)dear_param_int(DEAR_P_SPARSE_AGREE)) {
        st->form = FORM_AGREE;
        rc = agree_start(r, st);
    } else {
        st->form = FORM_SPARSE;
        rc = rs ? rs_start(r, st) : ag_start(r, st);
    }
out:
    return rc;
}

static void sparse_each_req(dear_coll_req_t *r, dear_net_req_fn_t fn, void *arg)
{
    sparse_state_t *st = r->state;
    for (int i = 0; i < st->npeers; i++) {
        if (st->rreq != NULL)
            fn(&st->rreq[i], arg);
        if (st->sreq != NULL)
            fn(&st->sreq[i], arg);
    }
    for (int i = 0; st->areq != NULL && i < 2 * st->npeers; i++)
        fn(&st->areq[i], arg);
    dear_coll_each_req(st->sub, fn, arg);
}

static void sparse_cleanup(dear_coll_req_t *r)
{
    sparse_state_t *st = r->state;
    if (st == NULL)
        return;
    sparse_each_req(r, dear_coll_abandon_one, NULL);
    dear_coll_free(st->sub);
    dear_coll_scratch_put(st->pack, st->pack_cap);
    free(st->rreq);
    free(st->sreq);
    free(st->rbytes);
    free(st->msgs);
    free(st->areq);
    free(st->abytes);
    free(st->slots);
    free(st->idx);
    free(st->acc);
    free(st->cover);
    free(st->slot_at);
    free(st->fwd_of);
    free(st->fwd_owner);
    free(st->fwd_slot);
    free(st->grid);
    free(st->grid_at);
    free(st);
    r->state = NULL;
}

size_t dear_coll_sparse_nonzero(dear_dtype_t dtype, const void *vec, size_t count, size_t sparse_block)
{
    size_t es = dear_dtype_size(dtype), k = 0;
    if (sparse_block == 0 || vec == NULL)
        return 0;
    const char *v = vec;
    for (size_t at = 0; at < count;) {
        at += dear_reduce_zero_prefix(v + at * es, (count - at) * es) / es;
        if (at < count) {
            k++;
            at = (at / sparse_block + 1) * sparse_block;  /* the next block */
        }
    }
    return k;
}

const dear_coll_algo_ops_t dear_coll_sparse_ops = { "sparse", sparse_start, sparse_progress, sparse_cleanup,
                                                    sparse_each_req };

/*
 * Collectives under mpirun (Check, CK_FORK=no): every algorithm x type x {in place, out of
 * place} x counts {0, 1, P-1, P, P+1, random, 1000003 (a subset)} x {reduce-scatter,
 * all-gather, all-reduce}, with and without scale, against MPI_Allreduce in double precision on
 * the same data: exact on integer-valued data, a relative bound on random floats. Also several
 * collectives in flight at once completing in a different order on each rank, multi-block
 * all-gathers against a reference, the bad-argument cases, the reduction kernels' 16-bit
 * rounding against the compiler's _Float16 and a long-hand bfloat16 rounding, the selection
 * table's DEAR_COLL_ALGO override, and the hierarchical algorithm over synthetic hosts.
 * The block-sparse collectives (algo sparse) run in the sweeps with 3-element blocks, and in
 * test_sparse over per-rank block patterns (all-zero, all-dense, one block, the ragged tail,
 * blocks of -0.0, random densities from 0.1% to 100%) in every type: bitwise against direct on the
 * same input, by value against MPI_Allreduce, and each message's form (sparse or dense) and the
 * bytes sent against a byte-wise count.
 *
 * Every rank reaches every assertion: local mismatches are combined with MPI_Allreduce before
 * ck_assert, so one failing rank cannot leave the others waiting in a collective.
 * Arguments: --quick skips the 1000003-element cases (and, on interleaved hier hosts, types other
 * than float32 and bfloat16); --hier-only runs test_hier alone; --hier-hosts H its layouts of H
 * hosts alone; --sparse-only the sparse tests alone; --socket routes the communicator (and each
 * hier layout's) through the socket transport, which must then have carried messages.
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "collectives/coll.h"
#include "collectives/net.h"
#include "collectives/reduce.h"
#include "include/dear.h"
#include "base/log.h"
#include "base/params.h"
#include "base/util.h"
#include "tests/mpi/coll_check.h"

static int g_quick;

#define GUARD 8                 /* elements past every receive buffer that must stay untouched */
#define SENTINEL_BYTE 0x5A
/* Elements per block for algo sparse in the sweeps (the dense algorithms ignore it): 3, so that
 * blocks straddle shard boundaries and the last one is often ragged. */
#define SWEEP_BLOCK 3

/* Every algorithm of the table (base/algo_table.h) with or without the hosts it needs, then
 * auto; filled by algo_lists. */
static dear_coll_algo_t flat_algos[DEAR_ALGO_COUNT], host_algos[DEAR_ALGO_COUNT];
static int n_flat, n_host;
/* What the sweeps run: every flat algorithm, or (test_hier) the host algorithms and auto over
 * g_topo. */
static const dear_coll_algo_t *algos = flat_algos;
static int NALGOS;

static void algo_lists(void)
{
    n_flat = n_host = 0;
    for (int a = DEAR_ALGO_AUTO + 1; a < DEAR_ALGO_COUNT; a++) {
        if (dear_coll_algo_flags((dear_coll_algo_t)a) & DEAR_ALGO_F_NATIVE)
            continue; /* a device transport's own (tests/cuda) */
        if (dear_coll_algo_flags((dear_coll_algo_t)a) & DEAR_ALGO_F_NEEDS_HOSTS)
            host_algos[n_host++] = (dear_coll_algo_t)a;
        else
            flat_algos[n_flat++] = (dear_coll_algo_t)a;
    }
    flat_algos[n_flat++] = DEAR_ALGO_AUTO;
    host_algos[n_host++] = DEAR_ALGO_AUTO;
    NALGOS = n_flat;
}
static const dear_coll_topo_t *g_topo;
static int g_hier_only, g_sparse_only, g_hier_hosts;
/* The current hier layout maps ranks to hosts interleaved (test_hier). */
static int g_interleaved;

/* Element i of rank r's input: small integers, so every sum is exact in every type. */
static double int_value(int r, size_t i) { return (double)((long)((i * 7 + (size_t)r * 13) % 17) - 8); }

/* The value a correct collective stores for a reduced sum (exact in double) and a scale: the
 * library scales in the accumulation type and rounds once to the element type. */
static double expected_of(dear_dtype_t t, double sum, double scale)
{
    switch (t) {
    case DEAR_FLOAT64: return sum * scale;
    case DEAR_INT32: return sum;
    case DEAR_FLOAT32: return (float)((float)sum * (float)scale);
    case DEAR_BFLOAT16: return dear_bf16_to_float(dear_float_to_bf16((float)sum * (float)scale));
    case DEAR_FLOAT16: return dear_half_to_float(dear_float_to_half((float)sum * (float)scale));
    }
    return NAN;
}

/* A random 16-bit value whose sums over up to 8 ranks are exact in float32: m * 2^-e with m of at
 * most the type's significand (8 bits bfloat16, 11 float16), e in a range of 10: the float32 sum
 * rounded once is then one value, whatever the order of the additions. */
static double rand_value16(dear_dtype_t t, int r, size_t i)
{
    double u = rand_value(r, i), v = rand_value(r + 101, i);
    int bits = t == DEAR_BFLOAT16 ? 8 : 11, e = (int)((v + 1) * 5.0) + (t == DEAR_BFLOAT16 ? 0 : 4);
    double m = (double)(long)(u * (double)(1 << (bits - 1)));
    return ldexp(m, -e);
}

static int is16(dear_dtype_t t) { return t == DEAR_BFLOAT16 || t == DEAR_FLOAT16; }

/* Relative bound for random float32 and float64 data: rounding in the element type, up to P hops.
 * 16-bit random data have exact float32 sums (rand_value16) and are held to the value rounded
 * once: no bound. */
static double tolerance(dear_dtype_t t)
{
    switch (t) {
    case DEAR_FLOAT32: return 8.0 * g_size * 0x1p-24;
    case DEAR_FLOAT64: return 8.0 * g_size * 0x1p-53;
    case DEAR_BFLOAT16: return 2.0 * g_size * 0x1p-8;
    case DEAR_FLOAT16: return 2.0 * g_size * 0x1p-11;
    default: return 0;
    }
}

static int guard_ok(const char *p) {
    for (size_t i = 0; i < GUARD * 8; i++)
        if ((unsigned char)p[i] != SENTINEL_BYTE)
            return 0;
    return 1;
}

typedef struct {
    dear_coll_op_t op;
    dear_coll_algo_t algo;
    dear_dtype_t t;
    int in_place;
    size_t count;
    double scale;
    int random;
    int tag;
} case_t;

/* Element i of rank r's input for case c. */
static double input_value(const case_t *c, int r, size_t i)
{
    if (!c->random)
        return int_value(r, i);
    return is16(c->t) ? rand_value16(c->t, r, i) : rand_value(r, i);
}

/* Prepared buffers of one case plus the reference it is checked against. */
typedef struct {
    case_t c;
    size_t es, off, len;
    char *send, *recv;
    double *ref, *absref;       /* full vector: expected sum and sum of |x| */
} run_t;

static void run_prepare(run_t *r, const case_t *c)
{
    memset(r, 0, sizeof *r);
    r->c = *c;
    r->es = dear_dtype_size(c->t);
    dear_coll_shard(c->count, g_size, g_rank, &r->off, &r->len);
    size_t n = c->count, es = r->es;
    size_t rcount = c->op == DEAR_COLL_REDUCE_SCATTER && !c->in_place ? r->len : n;
    size_t scount = c->op == DEAR_COLL_ALLGATHER ? r->len : n;
    r->recv = xmalloc((rcount + GUARD) * es + GUARD * 8);
    memset(r->recv, SENTINEL_BYTE, (rcount + GUARD) * es + GUARD * 8);
    r->send = c->in_place ? NULL : xmalloc(scount * es + 1);
    double *mine = xmalloc(n * sizeof(double)), *mabs = xmalloc(n * sizeof(double));
    r->ref = xmalloc(n * sizeof(double));
    r->absref = xmalloc(n * sizeof(double));
    char *in = c->in_place ? r->recv : r->send;
    if (c->op == DEAR_COLL_ALLGATHER) {
        /* Global vector g(i) = value of the owner; each rank contributes only its shard, so the
         * reference is the sum of zero-padded vectors. */
        for (size_t i = 0; i < n; i++) {
            int own = i >= r->off && i < r->off + r->len;
            double v = input_value(c, c->random ? 7 : 3, i);
            if (own) {
                dear_elem_put(c->t, in, c->in_place ? i : i - r->off, v);
                mine[i] = dear_elem_get(c->t, in, c->in_place ? i : i - r->off);
            } else {
                mine[i] = 0;
                if (c->in_place)
                    dear_elem_put(c->t, in, i, 99);
            }
            mabs[i] = fabs(mine[i]);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            dear_elem_put(c->t, in, i, input_value(c, g_rank, i));
            mine[i] = dear_elem_get(c->t, in, i);
            mabs[i] = fabs(mine[i]);
        }
    }
    MPI_Allreduce(mine, r->ref, (int)n, MPI_DOUBLE, MPI_SUM, g_comm);
    MPI_Allreduce(mabs, r->absref, (int)n, MPI_DOUBLE, MPI_SUM, g_comm);
    free(mine);
    free(mabs);
}

static int run_start(run_t *r, dear_coll_req_t **req)
{
    dear_coll_args_t a = { .op = r->c.op, .algo = r->c.algo, .dtype = r->c.t, .comm = g_comm, .net = g_net,
                           .tag = r->c.tag, .scale = r->c.scale, .sendbuf = r->send,
                           .recvbuf = r->recv, .count = r->c.count, .topo = g_topo,
                           .sparse_block = SWEEP_BLOCK };
    return dear_coll_start(&a, req);
}

static int elem_bad(const run_t *r, size_t i, double got, double sum, double abssum, double scale)
{
    double want = expected_of(r->c.t, sum, scale);
    if (!r->c.random || is16(r->c.t))
        return got != want;
    double tol = tolerance(r->c.t) * abssum * fabs(scale) + 1e-30;
    if (r->c.t == DEAR_FLOAT16)
        tol += 0x1p-24 * g_size;  /* subnormal spacing */
    return !(fabs(got - want) <= tol);
}

/* 1 when this rank's result is wrong (the first error is noted). */
static int run_check(run_t *r)
{
    const case_t *c = &r->c;
    int bad = 0;
    const char *name = dear_coll_op_name(c->op);
    size_t lo = 0, hi = c->count;
    const char *res = r->recv;
    size_t rcount = c->count;
    if (c->op == DEAR_COLL_REDUCE_SCATTER) {
        lo = r->off, hi = r->off + r->len;
        if (!c->in_place) {
            res = r->recv - r->off * r->es;  /* index with global i */
            rcount = r->len;
        }
    }
    double scale = c->op == DEAR_COLL_ALLGATHER ? 1.0 : c->scale;
    for (size_t i = lo; i < hi && !bad; i++) {
        double got = dear_elem_get(c->t, res, i);
        bad = note(elem_bad(r, i, got, r->ref[i], r->absref[i], scale),
                   "%s algo %s %s %s count %zu scale %g: element %zu is %.9g, expected %.9g",
                   name, dear_coll_algo_name(c->algo), dear_dtype_name(c->t),
                   c->in_place ? "in place" : "out of place", c->count, c->scale, i, got,
                   expected_of(c->t, r->ref[i], scale));
    }
    if (!bad)
        bad = note(!guard_ok(r->recv + rcount * r->es), "%s algo %s %s count %zu: wrote past recvbuf",
                   name, dear_coll_algo_name(c->algo), dear_dtype_name(c->t), c->count);
    /* Our all-reduces sum each element once, at its owner, and gather the result: every rank
     * holds the same bits (Open MPI's own may sum in another order on each rank). */
    if (c->op == DEAR_COLL_ALLREDUCE && c->algo != DEAR_ALGO_MPI) {
        size_t nb = c->count * r->es;
        char *root = xmalloc(nb);
        memcpy(root, r->recv, nb);
        MPI_Bcast(root, (int)nb, MPI_BYTE, 0, g_comm);
        bad |= note(memcmp(root, r->recv, nb) != 0, "allreduce algo %s %s count %zu: result differs from rank 0's",
                    dear_coll_algo_name(c->algo), dear_dtype_name(c->t), c->count);
        free(root);
    }
    return bad;
}

static void run_free(run_t *r)
{
    free(r->send);
    free(r->recv);
    free(r->ref);
    free(r->absref);
}

static int run_one(const case_t *c)
{
    run_t r;
    run_prepare(&r, c);
    dear_coll_req_t *req = NULL;
    int rc = run_start(&r, &req);
    int bad = note(rc != DEAR_OK, "start %s %s: %s", dear_coll_op_name(c->op),
                   dear_coll_algo_name(c->algo), dear_status_string(rc));
    if (!bad) {
        rc = dear_coll_wait(req);
        bad = note(rc != DEAR_OK, "wait: %s", dear_status_string(rc));
    }
    if (!bad)
        bad = run_check(&r);
    dear_coll_free(req);
    run_free(&r);
    return bad;
}

/* Same random count on every rank. */
static size_t random_count(unsigned seed)
{
    unsigned long x = 1103515245ul * (seed + 12345ul) + 12345ul;
    return 2 + (x >> 8) % 40000;
}

/* Every algorithm of the current list x type x {in, out of} place x each count, with and
 * without scale, exact against MPI_Allreduce in float64. */
static void sweep_counts(dear_coll_op_t op, const size_t *counts, int ncounts)
{
    static const dear_dtype_t types[] = { DEAR_FLOAT32, DEAR_FLOAT64, DEAR_BFLOAT16, DEAR_FLOAT16,
                                          DEAR_INT32 };
    int P = g_size, bad = 0, ncases = 0;
    g_first_err[0] = '\0';
    for (int a = 0; a < NALGOS; a++)
        for (int t = 0; t < 5; t++)
            for (int ip = 0; ip < 2; ip++)
                for (int k = 0; k < ncounts; k++) {
                    int big = counts[k] == 1000003;
                    /* The big count (time): float32; ring in and out of place, rhd, mpi and
                     * direct in place (auto is the ring there). */
                    if (big && (g_quick || types[t] != DEAR_FLOAT32 || algos[a] == DEAR_ALGO_AUTO ||
                                (algos[a] != DEAR_ALGO_RING && !ip)))
                        continue;
                    if (g_topo && counts[k] == 1 && types[t] != DEAR_FLOAT32)
                        continue; /* hier: fewer tiny cases (time); every count in float32 */
                    /* Interleaved hosts change the rank mapping, not the arithmetic: with
                     * --quick one 32-bit and one 16-bit type cover it (time under MPICH). */
                    if (g_quick && g_interleaved && types[t] != DEAR_FLOAT32 &&
                        types[t] != DEAR_BFLOAT16)
                        continue;
                    for (int s = 0; s < 2; s++) {
                        if (s == 1 && (types[t] == DEAR_INT32 || op == DEAR_COLL_ALLGATHER || big))
                            continue;
                        case_t c = { op, algos[a], types[t], ip, counts[k], s ? 1.0 / P : 1.0, 0, 7 };
                        bad |= run_one(&c);
                        ncases++;
                    }
                }
    assert_all_ok(bad, dear_coll_op_name(op));
    if (g_rank == 0)
        fprintf(stderr, "%s: %d exact cases passed on %d ranks\n", dear_coll_op_name(op), ncases, P);
}

static void sweep(dear_coll_op_t op)
{
    size_t P = (size_t)g_size;
    size_t counts[] = { 0, 1, P - 1, P, P + 1, random_count((unsigned)op), 1000003 };
    sweep_counts(op, counts, (int)(sizeof counts / sizeof counts[0]));
}

START_TEST(test_reduce_scatter) { sweep(DEAR_COLL_REDUCE_SCATTER); }
END_TEST

START_TEST(test_allgather) { sweep(DEAR_COLL_ALLGATHER); }
END_TEST

START_TEST(test_allreduce) { sweep(DEAR_COLL_ALLREDUCE); }
END_TEST

/* Random floats: relative bound against the double-precision MPI_Allreduce. */
START_TEST(test_random_floats)
{
    static const dear_dtype_t types[] = { DEAR_FLOAT32, DEAR_FLOAT64, DEAR_BFLOAT16, DEAR_FLOAT16 };
    int bad = 0;
    g_first_err[0] = '\0';
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        for (int a = 0; a < NALGOS; a++)
            for (int t = 0; t < 4; t++)
                for (int ip = 0; ip < 2; ip++) {
                    case_t c = { (dear_coll_op_t)op, algos[a], types[t], ip, 5000 + 3 * (size_t)g_size,
                                 op == DEAR_COLL_ALLGATHER ? 1.0 : 0.25, 1, 3 };
                    bad |= run_one(&c);
                }
    assert_all_ok(bad, "random floats");
}
END_TEST

/* Several collectives in flight on one communicator with distinct tags, progressed in a
 * different order on each rank, half waited for by wait-any and the rest in reverse. */
START_TEST(test_many_in_flight)
{
    enum { N = 9 };
    run_t runs[N];
    dear_coll_req_t *reqs[N];
    int done[N] = { 0 }, bad = 0, rc;
    g_first_err[0] = '\0';
    for (int i = 0; i < N; i++) {
        case_t c = { (dear_coll_op_t)(i % 3), algos[(i / 3) % NALGOS], i % 2 ? DEAR_FLOAT32 : DEAR_BFLOAT16,
                     i % 2, 20000 + 1000 * (size_t)i, i % 3 == 1 ? 1.0 : 0.5, 0, 100 + i };
        run_prepare(&runs[i], &c);
        rc = run_start(&runs[i], &reqs[i]);
        ck_assert_int_eq(rc, DEAR_OK);
    }
    /* Rank-dependent progress order: rotate by rank, then finish in reverse. */
    for (int sweep_i = 0; sweep_i < 3; sweep_i++)
        for (int k = 0; k < N; k++) {
            int i = (k + g_rank * 4) % N;
            if (!done[i]) {
                rc = dear_coll_progress(reqs[i], &done[i]);
                bad |= note(rc != DEAR_OK, "progress %d: %s", i, dear_status_string(rc));
            }
        }
    /* Half of them by wait-any over those left, whatever finishes first (results checked below). */
    int left[N], nleft = N, which = -1;
    for (int i = 0; i < N; i++)
        left[i] = i;
    while (nleft > N / 2) {
        dear_coll_req_t *open_reqs[N];
        for (int k = 0; k < nleft; k++)
            open_reqs[k] = reqs[left[k]];
        rc = dear_coll_waitany(open_reqs, nleft, &which);
        bad |= note(rc != DEAR_OK || which < 0 || which >= nleft, "waitany: %s, index %d of %d",
                    dear_status_string(rc), which, nleft);
        if (bad)
            break;
        int d = 0;
        rc = dear_coll_progress(reqs[left[which]], &d);
        bad |= note(rc != DEAR_OK || !d, "waitany returned %d, which is not done", left[which]);
        left[which] = left[--nleft];
    }
    ck_assert_int_eq(dear_coll_waitany(NULL, 1, &which), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_coll_waitany(reqs, 0, &which), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_coll_waitany(reqs, 1, NULL), DEAR_ERR_ARG);
    for (int i = N - 1; i >= 0; i--) {
        rc = dear_coll_wait(reqs[i]);
        bad |= note(rc != DEAR_OK, "wait %d: %s", i, dear_status_string(rc));
        dear_coll_info_t info;
        dear_coll_get_info(reqs[i], &info);
        bad |= note(info.op != runs[i].c.op, "info.op of %d", i);
        bad |= note(info.bytes != runs[i].c.count * runs[i].es, "info.bytes of %d", i);
    }
    for (int i = 0; i < N; i++) {
        bad |= run_check(&runs[i]);
        dear_coll_free(reqs[i]);
        run_free(&runs[i]);
    }
    assert_all_ok(bad, "many in flight");
}
END_TEST

/* Multi-block collectives. All-gather: block b element i = value(b, i) on its owner; outside
 * [lo, hi) stays untouched. Reduce-scatter: rank r holds value(b, i) + r everywhere; its own
 * pieces end as the exact sum over the ranks, integer-valued so 16-bit types stay exact too. */
static double block_value(int b, size_t i) { return (double)(int)((b * 31 + i * 5) % 23) - 11; }

static int check_blocks(dear_coll_op_t op, dear_dtype_t t, dear_coll_algo_t algo, int nb, const size_t *cnt,
                        const size_t *lo, const size_t *hi)
{
    dear_coll_block_t blocks[8];
    int bad = 0, rs = op == DEAR_COLL_REDUCE_SCATTER;
    size_t es = dear_dtype_size(t);
    for (int b = 0; b < nb; b++) {
        float *v = xmalloc(cnt[b] * sizeof(float) + 1);
        char *buf = xmalloc(cnt[b] * es + 1);
        for (size_t i = 0; i < cnt[b]; i++) {
            size_t off, len;
            dear_coll_shard(cnt[b], g_size, g_rank, &off, &len);
            int own = i >= off && i < off + len && i >= lo[b] && i < hi[b];
            v[i] = rs ? (float)(block_value(b, i) + g_rank) : own ? (float)block_value(b, i) : -1000.0f;
        }
        dear_reduce_narrow(t, buf, v, cnt[b], 1.0);
        free(v);
        blocks[b] = (dear_coll_block_t){ buf, cnt[b], lo[b], hi[b], NULL };
    }
    dear_coll_args_t a = { .op = op, .algo = algo, .dtype = t, .comm = g_comm, .net = g_net, .tag = 9, .scale = 1.0,
                           .nblocks = nb, .blocks = blocks, .topo = g_topo, .sparse_block = SWEEP_BLOCK };
    dear_coll_req_t *req = NULL;
    int rc = dear_coll_start(&a, &req);
    bad |= note(rc != DEAR_OK, "multi-block start: %s", dear_status_string(rc));
    if (rc == DEAR_OK)
        bad |= note(dear_coll_wait(req) != DEAR_OK, "multi-block wait");
    double ranks_sum = (double)g_size * (g_size - 1) / 2;
    for (int b = 0; b < nb && !bad; b++) {
        float *got = xmalloc(cnt[b] * sizeof(float) + 1);
        dear_reduce_widen(t, got, blocks[b].buf, cnt[b]);
        size_t off, len;
        dear_coll_shard(cnt[b], g_size, g_rank, &off, &len);
        for (size_t i = 0; i < cnt[b] && !bad; i++) {
            int travels = i >= lo[b] && i < hi[b];
            int own = i >= off && i < off + len && travels;
            if (rs && !own)
                continue; /* unspecified */
            double want = rs ? g_size * block_value(b, i) + ranks_sum : travels ? block_value(b, i) : -1000.0;
            bad |= note(got[i] != want, "multi-block %s %s algo %s nblocks %d block %d [%zu,%zu) of %zu: "
                        "element %zu is %g, expected %g", dear_coll_op_name(op), dear_dtype_name(t),
                        dear_coll_algo_name(algo), nb, b, lo[b], hi[b], cnt[b], i, got[i], want);
        }
        free(got);
    }
    for (int b = 0; b < nb; b++)
        free(blocks[b].buf);
    dear_coll_free(req);
    return bad;
}

START_TEST(test_multi_block)
{
    int bad = 0;
    g_first_err[0] = '\0';
    size_t P = (size_t)g_size;
    size_t c3[] = { 1000, 7 * P + 3, 5 }, lo3[] = { 100, 0, 2 }, hi3[] = { 777, 7 * P + 3, 2 };
    size_t c1[] = { 3000 }, lo1[] = { 17 }, hi1[] = { 2500 };
    size_t cf[] = { 4 * P + 1, 50 }, lof[] = { 0, 0 }, hif[] = { 4 * P + 1, 50 };
    /* A bucket cut into sub-vectors, as the runtime cuts one at its all-gather groups. */
    size_t cs[] = { 600, 1, 3 * P + 2, 4000 }, los[] = { 0, 0, 0, 0 }, his[] = { 600, 1, 3 * P + 2, 4000 };
    for (int o = 0; o < 2; o++) {
        dear_coll_op_t op = o ? DEAR_COLL_REDUCE_SCATTER : DEAR_COLL_ALLGATHER;
        for (int a = 0; a < NALGOS; a++) {
            bad |= check_blocks(op, DEAR_FLOAT32, algos[a], 3, c3, lo3, hi3);
            bad |= check_blocks(op, DEAR_FLOAT32, algos[a], 1, c1, lo1, hi1);
            bad |= check_blocks(op, DEAR_FLOAT32, algos[a], 2, cf, lof, hif);
            bad |= check_blocks(op, DEAR_FLOAT32, algos[a], 4, cs, los, his);
        }
        bad |= check_blocks(op, DEAR_BFLOAT16, DEAR_ALGO_AUTO, 3, c3, lo3, hi3);
        bad |= check_blocks(op, DEAR_FLOAT16, DEAR_ALGO_AUTO, 4, cs, los, his);
    }
    assert_all_ok(bad, "multi-block reduce-scatter and allgather");
}
END_TEST

static char g_logged[512];
static void capture(const char *line, void *arg)
{
    snprintf(g_logged, sizeof g_logged, "%s", line);
}

/* Every bad-argument case of coll.h: DEAR_ERR_ARG and *req untouched. */
START_TEST(test_bad_args)
{
    float buf[64], other[64];
    dear_coll_block_t blk = { buf, 10, 5, 3, NULL };
    dear_coll_args_t good = { .op = DEAR_COLL_ALLREDUCE, .algo = DEAR_ALGO_RING, .dtype = DEAR_FLOAT32,
                              .comm = g_comm, .net = g_net, .tag = 1, .scale = 1.0, .sendbuf = other,
                              .recvbuf = buf, .count = 16 };
    dear_coll_args_t cases[20];
    int n = 0;
    cases[n] = good, cases[n++].recvbuf = NULL;                     /* NULL recvbuf, count > 0 */
    cases[n] = good, cases[n++].op = (dear_coll_op_t)7;             /* unknown op */
    cases[n] = good, cases[n++].algo = (dear_coll_algo_t)9;         /* unknown algo */
    cases[n] = good, cases[n++].dtype = (dear_dtype_t)42;           /* unknown type */
    cases[n] = good, cases[n].sendbuf = buf + 8, cases[n++].recvbuf = buf; /* overlap */
    cases[n] = good, cases[n].dtype = DEAR_INT32, cases[n++].scale = 0.5;  /* scale for int32 */
    cases[n] = good, cases[n++].scale = NAN;                        /* scale not finite */
    cases[n] = good, cases[n++].scale = 0.0;                        /* zero scale (struct left 0) */
    cases[n] = good, cases[n++].tag = -1;                           /* negative tag */
    cases[n] = good, cases[n++].comm = MPI_COMM_NULL;               /* no communicator */
    cases[n] = good, cases[n].op = DEAR_COLL_ALLGATHER, cases[n].nblocks = 1,
    cases[n++].blocks = &blk;                                       /* lo > hi */
    cases[n] = good, cases[n].op = DEAR_COLL_ALLGATHER, cases[n].nblocks = 1,
    cases[n++].blocks = NULL;                                       /* blocks NULL */
    cases[n] = good, cases[n].nblocks = 2, cases[n++].blocks = &blk; /* blocks for allreduce */
    cases[n] = good, cases[n++].nblocks = -1;                       /* negative nblocks */
    cases[n] = good, cases[n++].algo = DEAR_ALGO_SPARSE;            /* sparse without a block */
    dear_coll_req_t *sentinel = (dear_coll_req_t *)&good, *req;
    /* The expected errors are captured: each must log one line naming what was wrong. */
    dear_log_set_sink(capture, NULL);
    for (int i = 0; i < n; i++) {
        req = sentinel;
        g_logged[0] = '\0';
        int rc = dear_coll_start(&cases[i], &req);
        ck_assert_msg(rc == DEAR_ERR_ARG, "bad-argument case %d returned %d", i, rc);
        ck_assert_msg(req == sentinel, "bad-argument case %d touched *req", i);
        ck_assert_msg(strstr(g_logged, "dear_coll_start") != NULL, "case %d logged \"%s\"", i, g_logged);
    }
    ck_assert_int_eq(dear_coll_start(NULL, &req), DEAR_ERR_ARG);
    ck_assert_int_eq(dear_coll_start(&good, NULL), DEAR_ERR_ARG);
    int done;
    ck_assert_int_eq(dear_coll_progress(NULL, &done), DEAR_ERR_ARG);
    dear_log_set_sink(NULL, NULL);
    dear_coll_free(NULL);
    /* A block with hi == lo needs no buffer; blocks with nothing to move complete. */
    dear_coll_block_t empty = { NULL, 10, 4, 4, NULL };
    dear_coll_args_t e = good;
    e.op = DEAR_COLL_ALLGATHER, e.nblocks = 1, e.blocks = &empty, e.scale = 0.0; /* ignored */
    ck_assert_int_eq(dear_coll_start(&e, &req), DEAR_OK);
    ck_assert_int_eq(dear_coll_wait(req), DEAR_OK);
    dear_coll_free(req);
}
END_TEST

/* 16-bit conversions against independent references. */
START_TEST(test_conversions)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dear_half_to_float((unsigned short)h);
#if defined(__FLT16_MAX__)
        _Float16 x;
        uint16_t hb = (uint16_t)h;
        memcpy(&x, &hb, 2);
        float ref = (float)x;
        ck_assert_msg((isnan(f) && isnan(ref)) || f == ref, "half %04x -> %g, expected %g", h, f, ref);
#endif
        if (!isnan(f))
            ck_assert_msg(dear_float_to_half(f) == h, "half %04x does not round-trip", h);
        float b = dear_bf16_to_float((unsigned short)h);
        if (!isnan(b))
            ck_assert_msg(dear_float_to_bf16(b) == h, "bf16 %04x does not round-trip", h);
    }
    /* Rounding of values between representable points. */
    for (uint32_t i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)(i * 2654435761u);
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f))
            continue;
#if defined(__FLT16_MAX__)
        _Float16 x = (_Float16)f;
        uint16_t hb;
        memcpy(&hb, &x, 2);
        ck_assert_msg(dear_float_to_half(f) == hb, "float %a -> half %04x, expected %04x", (double)f,
                      dear_float_to_half(f), hb);
#endif
        /* bfloat16 long hand: the two neighbours by truncation, the nearer wins, ties to even. */
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        double dl = fabs((double)dear_bf16_to_float(lo) - f), dh = fabs((double)dear_bf16_to_float(hi) - f);
        uint16_t want = dl < dh ? lo : dh < dl ? hi : (lo % 2 == 0 ? lo : hi);
        if ((u & 0x7F800000u) == 0x7F800000u || (hi & 0x7F80u) == 0x7F80u)
            continue;  /* Inf neighbours: covered by the round trip above */
        ck_assert_msg(dear_float_to_bf16(f) == want, "float %a -> bf16 %04x, expected %04x", (double)f,
                      dear_float_to_bf16(f), want);
    }
}
END_TEST

START_TEST(test_select)
{
    size_t off, len, sum = 0;
    for (int r = 0; r < 5; r++) {
        dear_coll_shard(13, 5, r, &off, &len);
        ck_assert_uint_eq(off, sum);
        ck_assert_uint_eq(len, r < 3 ? 3 : 2);
        sum += len;
    }
    /* One host: a job of 4 ranks, all on this one (Open MPI's variables). */
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE"), *ws = getenv("OMPI_COMM_WORLD_SIZE");
    char saved[32] = "", saved_ws[32] = "";
    int had_ls = ls != NULL, had_ws = ws != NULL;
    if (had_ls)
        snprintf(saved, sizeof saved, "%s", ls);
    if (had_ws)
        snprintf(saved_ws, sizeof saved_ws, "%s", ws);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLREDUCE, 1 << 26, 4, NULL), DEAR_ALGO_RING);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLREDUCE, 64, 4, NULL), DEAR_ALGO_DIRECT);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLREDUCE, 64, 2, NULL), DEAR_ALGO_DIRECT);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_REDUCE_SCATTER, 1 << 20, 3, NULL), DEAR_ALGO_DIRECT);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_REDUCE_SCATTER, (1 << 20) + 4, 3, NULL), DEAR_ALGO_RING);
    /* Beyond 8 ranks the direct exchange is not used: rhd for small vectors, else the ring. */
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLREDUCE, 64, 16, NULL), DEAR_ALGO_RHD);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLGATHER, 1 << 20, 16, NULL), DEAR_ALGO_RING);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLGATHER, 64, 12, NULL), DEAR_ALGO_RING);
    /* A job of 4 ranks over several hosts (2 on this one): a 4-rank communicator takes the ring
     * for reduce-scatter at every size, for all-gather above 64 KiB and for all-reduce above
     * 256 KiB; a smaller communicator is taken as one host (every rank must decide alike). */
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_REDUCE_SCATTER, 64, 4, NULL), DEAR_ALGO_RING);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLGATHER, 64, 4, NULL), DEAR_ALGO_DIRECT);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLGATHER, 64 << 10, 4, NULL), DEAR_ALGO_DIRECT);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLGATHER, (64 << 10) + 4, 4, NULL), DEAR_ALGO_RING);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLREDUCE, 256 << 10, 4, NULL), DEAR_ALGO_DIRECT);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLREDUCE, (256 << 10) + 4, 4, NULL), DEAR_ALGO_RING);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_REDUCE_SCATTER, 64, 3, NULL), DEAR_ALGO_DIRECT);
    if (had_ls)
        setenv("OMPI_COMM_WORLD_LOCAL_SIZE", saved, 1);
    else
        unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (had_ws)
        setenv("OMPI_COMM_WORLD_SIZE", saved_ws, 1);
    else
        unsetenv("OMPI_COMM_WORLD_SIZE");
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLGATHER, 100, 1, NULL), DEAR_ALGO_RING);
    setenv("DEAR_COLL_ALGO", "mpi", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_int_eq(dear_coll_select(DEAR_COLL_ALLREDUCE, 64, 4, NULL), DEAR_ALGO_MPI);
    /* AUTO in the args follows the override; the info reports what ran. */
    float v[40];
    for (int i = 0; i < 40; i++)
        v[i] = (float)(i + g_rank);
    dear_coll_args_t a = { .op = DEAR_COLL_ALLREDUCE, .algo = DEAR_ALGO_AUTO, .dtype = DEAR_FLOAT32,
                           .comm = g_comm, .net = g_net, .tag = 4, .scale = 1.0, .recvbuf = v, .count = 40 };
    dear_coll_req_t *req = NULL;
    ck_assert_int_eq(dear_coll_start(&a, &req), DEAR_OK);
    ck_assert_int_eq(dear_coll_wait(req), DEAR_OK);
    dear_coll_info_t info;
    dear_coll_get_info(req, &info);
    dear_coll_free(req);
    ck_assert_int_eq(info.algo, DEAR_ALGO_MPI);
    ck_assert_uint_eq(info.bytes, sizeof v);
    for (int i = 0; i < 40; i++)
        ck_assert_msg(v[i] == (float)(g_size * i + g_size * (g_size - 1) / 2), "element %d is %g", i, v[i]);
    unsetenv("DEAR_COLL_ALGO");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
}
END_TEST

/* Counts around hier's segments (coll_hier.c: P pieces of DEAR_COLL_SEGMENT bytes each, so
 * seg32 elements of float32, half as many of float64, twice as many of the 16-bit types) with
 * DEAR_COLL_SEGMENT at its least, 1 KiB: less than one segment in every type, exactly one and
 * three (float32), a multiple plus a remainder that P does not divide, and tens of segments; every
 * op, type, place and scale of the sweeps. */
static void hier_segments(void)
{
    setenv("DEAR_COLL_SEGMENT", "1024", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    size_t P = (size_t)g_size, seg32 = 1024 / sizeof(float) * P;
    size_t counts[] = { seg32 / 2 - 1, seg32, 3 * seg32, 3 * seg32 + P + 1, 40 * seg32 + 7 };
    for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
        sweep_counts((dear_coll_op_t)op, counts, (int)(sizeof counts / sizeof counts[0]));
    test_random_floats_fn(0);
    test_many_in_flight_fn(0);
    unsetenv("DEAR_COLL_SEGMENT");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
}

/* Hierarchical collectives over synthetic hosts (ranks sharing a host id form a host; here
 * they all share one machine, so this checks the algorithm, not its speed): every grid H x L
 * of this run's ranks with H, L >= 2, ranks placed blocked (host = rank / L) and interleaved
 * (host = rank % H), so rank_of is not the identity. The sweeps, random floats, several in
 * flight and multi-block all-gathers run with hier and with auto (which picks hier at every
 * size), against the same float64 MPI_Allreduce reference; then again around the segment size
 * (hier_segments). Two hosts take the exchange between shifted partners, more the rings. */
/* --socket: route a layout's communicators through the transport (they stop with the layout). */
static void topo_route(dear_coll_topo_t *t)
{
    if (g_tp)
        ck_assert_int_eq(dear_coll_topo_attach(t, g_tp), DEAR_OK);
}

static void sp_hosts(void);
static void sp_sweep(void);

START_TEST(test_hier)
{
    int grids = 0;
    /* One machine: MPI's view is one host, so the topology stays flat. */
    dear_coll_topo_t *t = NULL;
    ck_assert_int_eq(dear_coll_topo_create(g_comm, -1, &t), DEAR_OK);
    ck_assert_ptr_null(t);
    for (int L = 2; L <= g_size / 2; L++) {
        if (g_size % L)
            continue;
        int H = g_size / L;
        if (g_hier_hosts && H != g_hier_hosts)
            continue;
        for (int inter = 0; inter < 2; inter++) {
            g_interleaved = inter;
            int host = inter ? g_rank % H : g_rank / L, n;
            ck_assert_int_eq(dear_coll_topo_create(g_comm, host, &t), DEAR_OK);
            ck_assert_ptr_nonnull(t);
            ck_assert_int_eq(t->nhosts, H);
            ck_assert_int_eq(t->local_size, L);
            ck_assert_int_eq(t->rank_of[t->host * L + t->local], g_rank);
            /* host_of and local_of invert rank_of, on every rank's entry */
            for (int p = 0; p < g_size; p++) {
                ck_assert_int_eq(t->host_of[p], inter ? p % H : p / L);
                ck_assert_int_eq(t->rank_of[t->host_of[p] * L + t->local_of[p]], p);
            }
            topo_route(t);
            for (int i = 0; i < 2; i++) {
                MPI_Comm_size(t->node[i], &n);
                ck_assert_int_eq(n, L);
                MPI_Comm_size(t->cross[i], &n);
                ck_assert_int_eq(n, H == 2 ? g_size : H);
            }
            if (g_rank == 0)
                fprintf(stderr, "hier: %d hosts x %d ranks, %s\n", H, L, inter ? "interleaved" : "blocked");
            for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
                ck_assert_int_eq(dear_coll_select((dear_coll_op_t)op, 4, g_size, t), DEAR_ALGO_HIER);
                ck_assert_int_eq(dear_coll_select((dear_coll_op_t)op, 8 << 10, g_size, t), DEAR_ALGO_HIER);
                ck_assert_int_eq(dear_coll_select((dear_coll_op_t)op, (size_t)1 << 30, g_size, t), DEAR_ALGO_HIER);
            }
            g_topo = t;
            algos = host_algos;
            NALGOS = n_host;
            sweep(DEAR_COLL_REDUCE_SCATTER);
            sweep(DEAR_COLL_ALLGATHER);
            sweep(DEAR_COLL_ALLREDUCE);
            test_random_floats_fn(0);
            test_many_in_flight_fn(0);
            test_multi_block_fn(0);
            hier_segments();
            sp_hosts();
            sp_sweep();
            algos = flat_algos;
            NALGOS = n_flat;
            g_topo = NULL;
            g_interleaved = 0;
            dear_coll_topo_free(t, 0);
            grids++;
        }
    }
    if (g_rank == 0)
        fprintf(stderr, "hier: %d layout(s) on %d ranks\n", grids, g_size);
    ck_assert_msg(!g_hier_hosts || grids == 2, "--hier-hosts %d: no layout of %d ranks on %d hosts",
                  g_hier_hosts, g_size, g_hier_hosts);
    /* hier asked for without a topology that fits: refused, naming what it needs. */
    float v[8] = { 0 };
    dear_coll_args_t a = { .op = DEAR_COLL_ALLREDUCE, .algo = DEAR_ALGO_HIER, .dtype = DEAR_FLOAT32,
                           .comm = g_comm, .net = g_net, .tag = 5, .scale = 1.0, .recvbuf = v, .count = 8 };
    dear_coll_req_t *req = NULL;
    ck_assert_int_eq(dear_coll_start(&a, &req), DEAR_ERR_UNSUPPORTED);
    ck_assert_ptr_null(req);
}
END_TEST

/* Buffers follow the message, not DEAR_COLL_SEGMENT: a ring reduce-scatter of 8 KiB with 1 GiB
 * segments runs with 256 MiB of address space to spare, which its receive slots of 1 GiB would break; and
 * the setting is bounded at 1 GiB. */
START_TEST(test_segment_bounded)
{
    setenv("DEAR_COLL_SEGMENT", "2g", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_ERR_PARAM);
    setenv("DEAR_COLL_SEGMENT", "1g", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    long long vm_kb = -1;
    char line[256];
    FILE *f = fopen("/proc/self/status", "r");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %lld kB", &vm_kb) == 1)
            break;
    fclose(f);
    ck_assert_int_gt(vm_kb, 0);
    struct rlimit old, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
    lim.rlim_cur = (rlim_t)vm_kb * 1024 + ((rlim_t)256 << 20);
    lim.rlim_max = old.rlim_max;
    if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < lim.rlim_cur)
        lim.rlim_cur = old.rlim_cur;
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &lim), 0);
    case_t c = { DEAR_COLL_REDUCE_SCATTER, DEAR_ALGO_RING, DEAR_FLOAT32, 0, 2048, 1.0, 0, 7 };
    int bad = run_one(&c);
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &old), 0);
    unsetenv("DEAR_COLL_SEGMENT");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    assert_all_ok(bad, "ring reduce-scatter with 1 GiB segments");
}
END_TEST

/* ---- block-sparse collectives (algo sparse) ---- */

/* Per-rank block patterns: which blocks of a rank's input are non-zero. K_NEGZERO's blocks hold
 * -0.0 (bitwise non-zero, so they travel; a rank that skips the block adds +0 in the dense sum). */
enum { K_ZERO, K_DENSE, K_ONE, K_TAIL, K_NEGZERO, K_RAND };
static const double sp_density[] = { 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 1.0 };
#define SP_NKINDS (K_RAND + (int)(sizeof sp_density / sizeof sp_density[0]))

static int sp_block_on(int kind, int r, size_t b, size_t nb)
{
    switch (kind) {
    case K_ZERO: return 0;
    case K_DENSE: return 1;
    case K_ONE: return b == ((size_t)r * 7 + 3) % nb;
    case K_TAIL: return b == nb - 1;
    case K_NEGZERO: return b % 3 == (size_t)r % 3;
    default: return (rand_value(r + 1000 * kind, b) + 1) / 2 < sp_density[kind - K_RAND];
    }
}

/* Rank r's input under kind: values as the sweeps' (exact sums for int32 and the 16-bit types)
 * in the blocks that are on, zeros elsewhere. */
static void sp_fill(dear_dtype_t t, char *v, size_t count, size_t block, int kind, int r)
{
    size_t nb = (count + block - 1) / block;
    memset(v, 0, count * dear_dtype_size(t));
    for (size_t i = 0; i < count; i++) {
        if (!sp_block_on(kind, r, i / block, nb))
            continue;
        double x = kind == K_NEGZERO ? -0.0 : t == DEAR_INT32 ? int_value(r, i) : is16(t) ? rand_value16(t, r, i)
                                                                                          : rand_value(r, i);
        dear_elem_put(t, v, i, x);
    }
}

/* The message the sparse collective must send for elements [off, off+len) of v, worked out byte
 * by byte: 1 sparse (pieces not all-bits-zero + a 4-byte index each + a 4-byte count, when that
 * is smaller), 0 dense, -1 none (empty shard); *bytes its size. */
static int sp_form(dear_dtype_t t, const char *v, size_t off, size_t len, size_t block, size_t *bytes)
{
    size_t es = dear_dtype_size(t), sparse = 4;
    *bytes = 0;
    if (len == 0)
        return -1;
    for (size_t a = off; a < off + len;) {
        size_t end = (a / block + 1) * block;
        end = end < off + len ? end : off + len;
        int nz = 0;
        for (size_t x = a * es; x < end * es; x++)
            nz |= v[x] != 0;
        sparse += nz ? 4 + (end - a) * es : 0;
        a = end;
    }
    *bytes = sparse < len * es ? sparse : len * es;
    return sparse < len * es;
}

typedef struct {
    size_t sparse, dense, bytes, fallbacks;
} sp_forms_t;

/* Adds `times` messages of shard [off, off+len) of v to f. */
static void sp_count(sp_forms_t *f, dear_dtype_t t, const char *v, size_t off, size_t len, size_t block, int times)
{
    size_t bytes;
    int form = sp_form(t, v, off, len, block, &bytes);
    if (form < 0)
        return;
    f->sparse += form == 1 ? (size_t)times : 0;
    f->dense += form == 0 ? (size_t)times : 0;
    f->bytes += bytes * (size_t)times;
}

/* Adds the all-gather's messages from this rank for v's shards (count elements): its own shard
 * to every peer; through partners (g_topo of H >= 2 hosts of L >= 2 ranks) to the host's ranks
 * and one partner on each other host, and L-1 times each shard it passes on: from each other
 * host, the owner whose partner on this host it is, the owner's local index from a lower host,
 * the one below (mod L) from a higher one (mirrors collectives/coll_sparse.c). */
static void sp_count_ag(sp_forms_t *f, dear_dtype_t t, const char *v, size_t count, size_t block)
{
    size_t off, len;
    dear_coll_shard(count, g_size, g_rank, &off, &len);
    const dear_coll_topo_t *tp = g_topo;
    if (tp == NULL || tp->nhosts < 2 || tp->local_size < 2) {
        sp_count(f, t, v, off, len, block, g_size - 1);
        return;
    }
    int L = tp->local_size, H = tp->nhosts;
    sp_count(f, t, v, off, len, block, L - 1 + H - 1);
    for (int h = 0; h < H; h++)
        for (int l = 0; l < L && h != tp->host; l++)
            if ((tp->host > h ? (l + L - 1) % L : l) == tp->local) {
                size_t po, pl;
                dear_coll_shard(count, g_size, tp->rank_of[h * L + l], &po, &pl);
                sp_count(f, t, v, po, pl, block, L - 1);
            }
}

/* One run of op by algo on input (count elements, as the caller of an in-place call holds it; an
 * out-of-place all-gather sends the own shard of it). result gets count elements (a
 * reduce-scatter's at [off, off+len), the rest untouched). 1 on failure (noted). */
static int sp_run(dear_coll_op_t op, dear_coll_algo_t algo, dear_dtype_t t, int in_place, size_t count,
                  size_t block, double scale, const char *input, char *result, dear_coll_info_t *info)
{
    size_t es = dear_dtype_size(t), off, len;
    dear_coll_shard(count, g_size, g_rank, &off, &len);
    size_t rn = op == DEAR_COLL_REDUCE_SCATTER && !in_place ? len : count;
    size_t sn = op == DEAR_COLL_ALLGATHER ? len : count, soff = op == DEAR_COLL_ALLGATHER ? off : 0;
    char *recv = xmalloc((rn + GUARD) * es + GUARD * 8), *send = NULL;
    memset(recv, SENTINEL_BYTE, (rn + GUARD) * es + GUARD * 8);
    if (in_place)
        memcpy(recv, input, count * es);
    else
        send = memcpy(xmalloc(sn * es + 1), input + soff * es, sn * es);
    dear_coll_args_t a = { .op = op, .algo = algo, .dtype = t, .comm = g_comm, .net = g_net, .tag = 11, .scale = scale,
                           .sendbuf = send, .recvbuf = recv, .count = count, .sparse_block = block,
                           .topo = g_topo };
    dear_coll_req_t *req = NULL;
    int rc = dear_coll_start(&a, &req);
    if (rc == DEAR_OK)
        rc = dear_coll_wait(req);
    dear_coll_get_info(req, info);
    dear_coll_free(req);
    int bad = note(rc != DEAR_OK, "sparse: %s %s %s count %zu block %zu: %s", dear_coll_op_name(op),
                   dear_coll_algo_name(algo), dear_dtype_name(t), count, block, dear_status_string(rc));
    bad = bad || note(!guard_ok(recv + rn * es), "sparse: %s %s count %zu: wrote past recvbuf",
                      dear_coll_op_name(op), dear_coll_algo_name(algo), count);
    if (op == DEAR_COLL_REDUCE_SCATTER)
        memcpy(result + off * es, in_place ? recv + off * es : recv, len * es);
    else
        memcpy(result, recv, count * es);
    free(recv);
    free(send);
    return bad;
}

/* Whether one half of the sparse collective on count elements runs the exchange, this rank
 * sending `bytes` in it: below DEAR_SPARSE_AGREE always; from there only while the most any
 * rank sends, times P/(P-1) at an even P >= 4, is below the bytes a ring sends per rank. */
static int sp_exchange(dear_dtype_t t, size_t count, size_t bytes)
{
    size_t es = dear_dtype_size(t), biggest = 0;
    if (g_size == 1 || count * es < (size_t)dear_param_int(DEAR_P_SPARSE_AGREE))
        return 1;
    unsigned long long mine = bytes, most = 0, P = (unsigned long long)g_size;
    MPI_Allreduce(&mine, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, g_comm);
    for (int p = 0; p < g_size; p++) {
        size_t off, len;
        dear_coll_shard(count, g_size, p, &off, &len);
        biggest = len > biggest ? len : biggest;
    }
    unsigned long long ring = (unsigned long long)(count - biggest) * es;
    return P >= 4 && P % 2 == 0 ? most * P < ring * (P - 1) : most < ring;
}

/* Adds one half's expected messages h to f: its forms when it runs the exchange, else the bytes
 * of the dense algorithm that replaces it (direct at these sizes on one host), dense_bytes. */
static void sp_half(sp_forms_t *f, const sp_forms_t *h, dear_dtype_t t, size_t count, size_t dense_bytes)
{
    if (sp_exchange(t, count, h->bytes)) {
        f->sparse += h->sparse, f->dense += h->dense, f->bytes += h->bytes;
    } else {
        f->bytes += dense_bytes;
        f->fallbacks++;
    }
}

/* One case: every rank fills its input with its kind (kinds[rank % nk]); sparse against direct
 * on the same input bitwise, against MPI_Allreduce in float64 by value, and each message's form
 * and the bytes sent against sp_form. */
static int sp_case(dear_coll_op_t op, dear_dtype_t t, int in_place, size_t count, size_t block, double scale,
                   const int *kinds, int nk, sp_forms_t *seen)
{
    size_t es = dear_dtype_size(t), off, len, n = count;
    dear_coll_shard(count, g_size, g_rank, &off, &len);
    char *input = xmalloc(n * es + 1), *got = xmalloc(n * es + 1), *want = xmalloc(n * es + 1);
    double *mine = xmalloc(n * sizeof(double) + 1), *ref = xmalloc(n * sizeof(double) + 1);
    double *mabs = xmalloc(n * sizeof(double) + 1), *absref = xmalloc(n * sizeof(double) + 1);
    int kind = kinds[g_rank % nk], bad = 0;
    sp_fill(t, input, n, block, kind, g_rank);
    for (size_t i = 0; i < n; i++)
        mine[i] = dear_elem_get(t, input, i), mabs[i] = fabs(mine[i]);
    MPI_Allreduce(mine, ref, (int)n, MPI_DOUBLE, MPI_SUM, g_comm);
    MPI_Allreduce(mabs, absref, (int)n, MPI_DOUBLE, MPI_SUM, g_comm);
    sp_forms_t expect = { 0, 0, 0, 0 }, rs = { 0, 0, 0, 0 }, ag = { 0, 0, 0, 0 };
    /* Bytes the dense direct exchange sends per half: the other shards, or the own to each peer. */
    size_t direct_rs = (n - len) * es, direct_ag = len * es * (size_t)(g_size - 1);
    if (op == DEAR_COLL_ALLGATHER) {
        /* The reduced vector (the union of the patterns) is gathered: own shard in place, the
         * rest of recvbuf left as garbage, which the collective must overwrite. */
        for (size_t i = 0; i < n; i++) {
            int own = i >= off && i < off + len;
            dear_elem_put(t, input, i, own ? expected_of(t, ref[i], 1.0) : 12345.0);
            ref[i] = expected_of(t, ref[i], 1.0);
            absref[i] = 0;
        }
    } else {
        for (int p = 0; p < g_size; p++) {
            size_t po, pl;
            dear_coll_shard(count, g_size, p, &po, &pl);
            if (p != g_rank)
                sp_count(&rs, t, input, po, pl, block, 1);
        }
        sp_half(&expect, &rs, t, n, direct_rs);
    }
    dear_coll_info_t info, dinfo;
    memset(got, 0, n * es);
    memset(want, 0, n * es);
    bad |= sp_run(op, DEAR_ALGO_SPARSE, t, in_place, count, block, scale, input, got, &info);
    bad |= sp_run(op, DEAR_ALGO_DIRECT, t, in_place, count, block, scale, input, want, &dinfo);
    if (op != DEAR_COLL_REDUCE_SCATTER) { /* the all-gather sends shards of the result */
        sp_count_ag(&ag, t, got, n, block);
        sp_half(&expect, &ag, t, n, direct_ag);
    }
    size_t lo = op == DEAR_COLL_REDUCE_SCATTER ? off : 0, hi = op == DEAR_COLL_REDUCE_SCATTER ? off + len : n;
    double sc = op == DEAR_COLL_ALLGATHER ? 1.0 : scale;
    const char *what = dear_coll_op_name(op), *tn = dear_dtype_name(t);
    for (size_t i = lo; i < hi && !bad; i++) {
        double g = dear_elem_get(t, got, i), w = expected_of(t, ref[i], sc);
        double tol = t == DEAR_INT32 || is16(t) ? 0 : tolerance(t) * absref[i] * fabs(sc);
        bad |= note(memcmp(got + i * es, want + i * es, es) != 0,
                    "sparse %s %s count %zu block %zu kind %d: element %zu is %a, direct gives %a", what, tn, count,
                    block, kind, i, g, dear_elem_get(t, want, i));
        bad |= note(!(fabs(g - w) <= tol), "sparse %s %s count %zu block %zu kind %d: element %zu is %.9g, "
                    "MPI_Allreduce gives %.9g", what, tn, count, block, kind, i, g, w);
    }
    bad |= note(info.algo != DEAR_ALGO_SPARSE || info.msgs_sparse != expect.sparse ||
                    info.msgs_dense != expect.dense || info.bytes_sent != expect.bytes,
                "sparse %s %s count %zu block %zu kind %d: algo %s sent %zu sparse + %zu dense messages, %zu bytes; "
                "expected %zu + %zu, %zu bytes", what, tn, count, block, kind, dear_coll_algo_name(info.algo),
                info.msgs_sparse, info.msgs_dense, info.bytes_sent, expect.sparse, expect.dense, expect.bytes);
    bad |= note(dinfo.msgs_sparse + dinfo.msgs_dense != 0, "direct reported sparse/dense messages");
    seen->sparse += info.msgs_sparse;
    seen->dense += info.msgs_dense;
    seen->fallbacks += expect.fallbacks;
    free(input), free(got), free(want), free(mine), free(ref), free(mabs), free(absref);
    return bad;
}

/* On the hosts of g_topo, where the dense algorithm is hier, the sparse collective takes the
 * exchange only while it puts fewer bytes on a host's link than hier would (collectives/
 * coll_sparse.c): every rank the same blocks of 4 values non-zero, 3 in 20 (the exchange, with
 * either rule), 9 in 20 (where the bytes per rank alone would still take it, but the
 * reduce-scatter's L copies across the link outweigh hier's one; the all-gather, through
 * partners, crosses once and keeps the exchange) and 19 in 20 (dense: hier), checked by value
 * and by form; in bfloat16 a reduce-scatter falls back to the ring (hier's 16-bit sums are not
 * exact), so the bytes per rank decide it and 9 in 20 keeps the exchange. */
static void sp_hosts(void)
{
    static const dear_dtype_t types[] = { DEAR_FLOAT32, DEAR_BFLOAT16 };
    const size_t block = 4, count = block * 64 * (size_t)g_size;
    const int L = g_topo->local_size;
    size_t off, len;
    dear_coll_shard(count, g_size, g_rank, &off, &len);
    ck_assert_int_eq(dear_coll_sparse_copies(DEAR_COLL_REDUCE_SCATTER, DEAR_FLOAT32, count * 4, g_size, g_topo), L);
    ck_assert_int_eq(dear_coll_sparse_copies(DEAR_COLL_ALLGATHER, DEAR_FLOAT32, count * 4, g_size, g_topo), 1);
    ck_assert_int_eq(dear_coll_sparse_copies(DEAR_COLL_REDUCE_SCATTER, DEAR_BFLOAT16, count * 2, g_size, g_topo), 1);
    ck_assert_int_eq(dear_coll_sparse_copies(DEAR_COLL_REDUCE_SCATTER, DEAR_FLOAT32, count * 4, g_size, NULL), 1);
    char *in = xmalloc(count * 4), *got = xmalloc(count * 4);
    setenv("DEAR_SPARSE_AGREE", "0", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    for (int ti = 0; ti < 2; ti++)
        for (int per20 = 3; per20 <= 19; per20 += per20 == 3 ? 6 : 10)
            for (int ag = 0; ag < 2; ag++) {
                dear_dtype_t t = types[ti];
                size_t es = dear_dtype_size(t), nz = 0;
                dear_coll_op_t op = ag ? DEAR_COLL_ALLGATHER : DEAR_COLL_REDUCE_SCATTER;
                for (size_t i = 0; i < count; i++) {
                    int on = (i / block * 7) % 20 < (size_t)per20;
                    dear_elem_put(t, in, i, on ? (double)(1 + i % 5) : 0.0);
                    nz += on && (ag ? i >= off && i < off + len : i < off || i >= off + len);
                }
                /* This rank's bytes: values and an index per block, a count per message; the
                 * all-gather sends its own shard's to every peer. */
                size_t mine = ag ? (nz * es + nz / block * 4 + 4) * (size_t)(g_size - 1)
                                 : nz * es + nz / block * 4 + 4 * (size_t)(g_size - 1);
                int flat_takes = sp_exchange(t, count, mine);
                dear_coll_info_t info;
                memset(got, 0, count * es);
                int bad = sp_run(op, DEAR_ALGO_SPARSE, t, 1, count, block, 1.0, in, got, &info);
                double k = ag ? 1 : g_size;
                for (size_t i = ag ? 0 : off; !bad && i < (ag ? count : off + len); i++)
                    bad = note(dear_elem_get(t, got, i) != k * dear_elem_get(t, in, i),
                               "sparse on hosts: %s %s element %zu is %g, want %g", dear_dtype_name(t),
                               dear_coll_op_short(op), i, dear_elem_get(t, got, i), k * dear_elem_get(t, in, i));
                ck_assert_msg(!bad, "%s", g_first_err);
                ck_assert_msg(flat_takes == (per20 < 19), "%s, %d in 20 blocks: the bytes per rank should %s",
                              dear_dtype_name(t), per20, per20 < 19 ? "take the exchange" : "fall back");
                int want = per20 == 3 || (per20 == 9 && (ag || t == DEAR_BFLOAT16));
                ck_assert_msg(want ? info.msgs_sparse > 0 : info.msgs_sparse + info.msgs_dense == 0,
                              "%s %s, %d in 20 blocks on %d hosts of %d: %zu sparse message(s); want %s",
                              dear_dtype_name(t), dear_coll_op_short(op), per20, g_topo->nhosts, L,
                              info.msgs_sparse, want ? "the exchange" : "hier, which puts fewer bytes on the link");
                ck_assert_msg(!want || info.msgs_sparse + info.msgs_dense == (size_t)g_size - 1,
                              "%s %s: %zu messages sent; the exchange sends P-1 (through partners too)",
                              dear_dtype_name(t), dear_coll_op_short(op), info.msgs_sparse + info.msgs_dense);
            }
    unsetenv("DEAR_SPARSE_AGREE");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    free(in);
    free(got);
}

/* Every type x op x in/out of place x (block, count) x pattern set, each rank its own pattern;
 * then with DEAR_SPARSE_AGREE=0, so that every half first agrees on its form, float32 and
 * bfloat16 in place again: dense patterns must fall back, sparse ones keep the exchange. On
 * hosts (g_topo: all-gathers through partners) the first pass alone, in float32 and bfloat16
 * (sp_hosts weighs the agreement there). */
static void sp_sweep(void)
{
    static const dear_dtype_t types[] = { DEAR_FLOAT32, DEAR_BFLOAT16, DEAR_FLOAT16, DEAR_FLOAT64, DEAR_INT32 };
    size_t P = (size_t)g_size;
    /* (block, count): one-element blocks over 0.1% densities, ragged 7s, 64s cut by shards, a
     * block larger than the vector, fewer elements than ranks, nothing. */
    const size_t shapes[][2] = { { 1, 20000 + P }, { 7, 7 * 40 * P + 5 }, { 64, 64 * 8 * P + 33 }, { 50, 31 },
                                 { 2, P - 1 }, { 5, 0 } };
    int nshapes = (int)(sizeof shapes / sizeof shapes[0]), bad = 0, ncases = 0;
    sp_forms_t seen = { 0, 0, 0, 0 }, agreed = { 0, 0, 0, 0 };
    g_first_err[0] = '\0';
    for (int pass = 0; pass < (g_topo ? 1 : 2); pass++) {
        if (pass == 1) {
            setenv("DEAR_SPARSE_AGREE", "0", 1);
            ck_assert_int_eq(dear_params_load(), DEAR_OK);
        }
        for (int t = 0; t < (pass || g_topo ? 2 : 5); t++)
            for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
                for (int ip = 0; ip < (pass ? 1 : 2); ip++)
                    for (int sh = 0; sh < nshapes; sh++)
                        /* sets 0..SP_NKINDS-1: rank r takes kind (set + r) (different on every
                         * rank); then every rank all-zero, all-dense, one block */
                        for (int set = 0; set < SP_NKINDS + 3; set++) {
                            if ((t > 0 || ip || pass || g_topo) && set % 3 != (op + sh) % 3 && set < SP_NKINDS)
                                continue;  /* float32 in place on one host sees every set; the rest a third (time) */
                            int kinds[8], nk = set < SP_NKINDS ? 8 : 1;
                            for (int k = 0; k < nk; k++)
                                kinds[k] = set < SP_NKINDS ? (set + k) % SP_NKINDS
                                                           : (int[]){ K_ZERO, K_DENSE, K_ONE }[set - SP_NKINDS];
                            double scale = types[t] == DEAR_INT32 || set % 2 ? 1.0 : 1.0 / (double)P;
                            bad |= sp_case((dear_coll_op_t)op, types[t], !ip, shapes[sh][1], shapes[sh][0], scale,
                                           kinds, nk, pass ? &agreed : &seen);
                            ncases++;
                        }
    }
    unsetenv("DEAR_SPARSE_AGREE");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    assert_all_ok(bad, "sparse collectives");
    /* Both forms ran (with more than one rank), and without agreement nothing fell back; with
     * it, both the exchange and the fallback ran. */
    ck_assert_msg(g_size == 1 || (seen.sparse > 0 && seen.dense > 0), "forms seen: %zu sparse, %zu dense",
                  seen.sparse, seen.dense);
    ck_assert_uint_eq(seen.fallbacks, 0);
    ck_assert_msg(g_size == 1 || g_topo || (agreed.sparse > 0 && agreed.fallbacks > 0),
                  "agreeing: %zu sparse messages, %zu fallbacks", agreed.sparse, agreed.fallbacks);
    if (g_rank == 0)
        fprintf(stderr, "sparse%s: %d cases passed on %d ranks (rank 0 sent %zu sparse, %zu dense messages; "
                        "agreeing first: %zu sparse, %zu dense, %zu halves fell back to direct)\n",
                g_topo ? " on hosts" : "", ncases, g_size, seen.sparse, seen.dense, agreed.sparse, agreed.dense,
                agreed.fallbacks);
}

/* A multi-block sparse reduce-scatter, as sharded updates run one bucket of several sparse tensors:
 * three blocks of rows of 5 elements, each block sharded on its own, so shard starts fall inside
 * rows and the rank-order staging vector puts no block's rows in step with one grid. Each block is
 * cut into rows from its own start: a touched row travels as one piece per shard it meets. The
 * result is the exact sum, and the bytes this rank sends are, per peer, the pieces of its touched
 * rows in the peer's shard, each with a 4-byte index, and a 4-byte count (or the dense shard when
 * that is no larger), counted here row by row. */
static void sp_rows(void)
{
    enum { NB = 3, ROW = 5 };
    const size_t rows[NB] = { 13 + (size_t)g_size, 7, 2 * (size_t)g_size + 3 };
    dear_coll_block_t blocks[NB];
    float *v[NB];
    size_t expect = 0;
    int bad = 0;
    g_first_err[0] = '\0';
    /* Rank r touches row k of block b where (3k + b + r) % 4 == 0: each rank other rows. */
#define TOUCHED(b, k, r) ((3 * (k) + (size_t)(b) + (size_t)(r)) % 4 == 0)
    for (int b = 0; b < NB; b++) {
        size_t n = rows[b] * ROW;
        v[b] = xmalloc(n * sizeof(float) + 1);
        for (size_t i = 0; i < n; i++)
            v[b][i] = TOUCHED(b, i / ROW, g_rank) ? (float)(1 + (i + (size_t)g_rank) % 5) : 0.0f;
        blocks[b] = (dear_coll_block_t){ v[b], n, 0, n, NULL };
    }
    for (int q = 0; q < g_size; q++) {
        if (q == g_rank)
            continue;
        size_t bytes = 4, dense = 0;
        for (int b = 0; b < NB; b++) {
            size_t at, n = dear_coll_block_piece(&blocks[b], g_size, q, &at);
            dense += n * sizeof(float);
            for (size_t k = at / ROW; n > 0 && k * ROW < at + n; k++) {
                size_t lo = k * ROW > at ? k * ROW : at, hi = (k + 1) * ROW < at + n ? (k + 1) * ROW : at + n;
                if (TOUCHED(b, k, g_rank))
                    bytes += (hi - lo) * sizeof(float) + 4;
            }
        }
        expect += bytes < dense ? bytes : dense;
    }
    dear_coll_args_t a = { .op = DEAR_COLL_REDUCE_SCATTER, .algo = DEAR_ALGO_SPARSE, .dtype = DEAR_FLOAT32,
                           .comm = g_comm, .net = g_net, .tag = 12, .scale = 1.0, .nblocks = NB, .blocks = blocks,
                           .topo = g_topo, .sparse_block = ROW };
    dear_coll_req_t *req = NULL;
    dear_coll_info_t info;
    int rc = dear_coll_start(&a, &req);
    if (rc == DEAR_OK)
        rc = dear_coll_wait(req);
    dear_coll_get_info(req, &info);
    dear_coll_free(req);
    bad |= note(rc != DEAR_OK, "sparse rows: %s", dear_status_string(rc));
    for (int b = 0; b < NB && !bad; b++) {
        size_t at, n = dear_coll_block_piece(&blocks[b], g_size, g_rank, &at);
        for (size_t i = at; i < at + n && !bad; i++) {
            double want = 0;
            for (int r = 0; r < g_size; r++)
                want += TOUCHED(b, i / ROW, r) ? 1 + (i + (size_t)r) % 5 : 0;
            bad |= note(v[b][i] != want, "sparse rows: block %d element %zu is %g, expected %g", b, i, v[b][i], want);
        }
    }
#undef TOUCHED
    bad |= note(g_size > 1 && (info.bytes_sent != expect || info.msgs_sparse == 0),
                "sparse rows: %zu bytes in %zu sparse message(s); rows cut from each block's start give %zu",
                info.bytes_sent, info.msgs_sparse, expect);
    for (int b = 0; b < NB; b++)
        free(v[b]);
    assert_all_ok(bad, "multi-block sparse reduce-scatter of rows");
}

START_TEST(test_sparse)
{
    sp_sweep();
    sp_rows();
}
END_TEST

/* The zero-block scan against a byte-wise count; sparse's bad arguments and the fallback when
 * DEAR_COLL_ALGO forces it onto a collective without blocks. */
START_TEST(test_sparse_args)
{
    static const size_t blocks[] = { 1, 3, 8, 64, 100, 1000 };
    for (int kind = 0; kind < SP_NKINDS; kind++)
        for (int b = 0; b < 6; b++) {
            size_t count = 4099, nb = 0, es = sizeof(float);
            char *v = xmalloc(count * es);
            sp_fill(DEAR_FLOAT32, v, count, blocks[b], kind, g_rank);
            for (size_t a = 0; a < count; a += blocks[b]) {
                size_t n = count - a < blocks[b] ? count - a : blocks[b];
                int nz = 0;
                for (size_t x = a * es; x < (a + n) * es; x++)
                    nz |= v[x] != 0;
                nb += (size_t)nz;
            }
            ck_assert_uint_eq(dear_coll_sparse_nonzero(DEAR_FLOAT32, v, count, blocks[b]), nb);
            free(v);
        }
    ck_assert_uint_eq(dear_coll_sparse_nonzero(DEAR_FLOAT32, NULL, 10, 3), 0);

    float buf[16] = { 0 };
    dear_coll_args_t a = { .op = DEAR_COLL_ALLREDUCE, .algo = DEAR_ALGO_SPARSE, .dtype = DEAR_FLOAT32,
                           .comm = g_comm, .net = g_net, .tag = 12, .scale = 1.0, .recvbuf = buf, .count = 16 };
    dear_coll_req_t *req = NULL;
    dear_log_set_sink(capture, NULL);
    g_logged[0] = '\0';
    ck_assert_int_eq(dear_coll_start(&a, &req), DEAR_ERR_ARG);
    ck_assert_msg(strstr(g_logged, "sparse_block 0") && strstr(g_logged, "accepted"), "logged \"%s\"", g_logged);
    a.sparse_block = 4;
    a.recvbuf = NULL;
    g_logged[0] = '\0';
    ck_assert_int_eq(dear_coll_start(&a, &req), DEAR_ERR_ARG);
    ck_assert_msg(strstr(g_logged, "recvbuf is NULL") != NULL, "logged \"%s\"", g_logged);
    dear_log_set_sink(NULL, NULL);
    ck_assert_ptr_null(req);

    /* Forced through DEAR_COLL_ALGO: sparse where a block is given, ring where none is. */
    setenv("DEAR_COLL_ALGO", "sparse", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    for (size_t blk = 0; blk < 8; blk += 4) {
        for (int i = 0; i < 16; i++)
            buf[i] = (float)(i % 4 == 0 ? g_rank + i : 0);
        a.algo = DEAR_ALGO_AUTO, a.recvbuf = buf, a.sparse_block = blk;
        ck_assert_int_eq(dear_coll_start(&a, &req), DEAR_OK);
        ck_assert_int_eq(dear_coll_wait(req), DEAR_OK);
        dear_coll_info_t info;
        dear_coll_get_info(req, &info);
        dear_coll_free(req);
        ck_assert_int_eq(info.algo, blk ? DEAR_ALGO_SPARSE : DEAR_ALGO_RING);
        for (int i = 0; i < 16; i++)
            ck_assert_msg(buf[i] == (i % 4 == 0 ? (float)(g_size * i + g_size * (g_size - 1) / 2) : 0.0f),
                          "block %zu: element %d is %g", blk, i, buf[i]);
    }
    unsetenv("DEAR_COLL_ALGO");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
}
END_TEST

int main(int argc, char **argv)
{
    int socket = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            g_quick = 1;
        if (strcmp(argv[i], "--hier-only") == 0)
            g_hier_only = 1;
        if (strcmp(argv[i], "--sparse-only") == 0)
            g_sparse_only = 1;
        if (strcmp(argv[i], "--hier-hosts") == 0 && i + 1 < argc)
            g_hier_hosts = atoi(argv[++i]);
        if (strcmp(argv[i], "--socket") == 0)
            socket = 1;
    }
    coll_test_init(&argc, &argv, socket);
    algo_lists();

    Suite *s = suite_create("coll");
    TCase *tc = tcase_create("coll");
    tcase_set_timeout(tc, 300);
    if (!g_hier_only && !g_sparse_only) {
        tcase_add_test(tc, test_select);
        tcase_add_test(tc, test_conversions);
        tcase_add_test(tc, test_bad_args);
        tcase_add_test(tc, test_reduce_scatter);
        tcase_add_test(tc, test_allgather);
        tcase_add_test(tc, test_allreduce);
        tcase_add_test(tc, test_random_floats);
        tcase_add_test(tc, test_many_in_flight);
        tcase_add_test(tc, test_multi_block);
        tcase_add_test(tc, test_segment_bounded);
    }
    if (!g_hier_only) {
        tcase_add_test(tc, test_sparse_args);
        tcase_add_test(tc, test_sparse);
    }
    if (!g_sparse_only)
        tcase_add_test(tc, test_hier);
    suite_add_tcase(s, tc);
    return coll_test_run(s);
}

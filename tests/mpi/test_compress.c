/*
 * Compressed collectives (collectives/coll.h, "Compression") under mpirun (Check, CK_FORK=no):
 * every algorithm of the table, and hier over synthetic hosts, x bfloat16 / float16 wire x
 * reduce-scatter, all-gather, all-reduce x in / out of place x counts, against MPI_Allreduce of the
 * same float32 data in float64:
 *   - integer-valued data, whose partial sums are exact in 16 bits: a reduce-scatter's result is
 *     the float32 sum times the scale, never rounded after it; an all-gather's is each value
 *     rounded once; an all-reduce's the scaled sum rounded once by its all-gather half (float32
 *     when that half is uncompressed, for the algorithms that compose it);
 *   - random float32 data: within P + 2 roundings of the 16-bit type of the float64 sum (the
 *     bound, in units of the sum of |x|), and every rank with the same bits after an all-reduce;
 *   - on two ranks the exact value of a ring, direct and sparse reduce-scatter: this rank's
 *     float32 input unrounded plus the peer's rounded once;
 *   - multi-block reduce-scatters and all-gathers, 16-bit user data (compress ignored: bitwise
 *     the uncompressed result), half the bytes on the wire, and an unknown format refused, as is
 *     int8 under DEAR_DETERMINISTIC;
 *   - error feedback's kernel, the host's (reduce.c) and the device's (cuda/kern_body.h) alike:
 *     v + e unchanged exactly, v then exact in 16 bits, e within half its unit; infinities and
 *     NaN leave e zero; int8 packing and unpacking alike too, byte for byte;
 *   - int8: every algorithm asked for (each runs direct; sparse stays sparse, its non-zero blocks'
 *     values packed, on vectors with one block in 8 non-zero), and
 *     hier over the synthetic hosts (hier, and auto where it picks hier, run hier: float32 inside
 *     a host, int8 across) x op x in / out of place x counts x the all-gather half int8, bf16 or
 *     float32, against float64: each element within half a block scale per quantization on its
 *     path (the peers' inputs, or under hier the other hosts' partial sums, then the averaged
 *     shard), every rank with the same bits; the bytes those of the packed chunks (under hier
 *     of the packed pieces across, float32 inside); error feedback keeping the error of 30
 *     repeated all-reduces' sum within one all-reduce's bound (without it, it grows), also
 *     through multi-block collectives, flat and under hier.
 * Arguments: --socket routes the communicator through the socket transport.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/params.h"
#include "base/util.h"
#include "collectives/coll.h"
#include "collectives/net.h"
#include "collectives/reduce.h"
#include "cuda/kern_body.h"
#include "include/dear.h"
#include "tests/mpi/coll_check.h"

static const dear_coll_topo_t *g_topo;

#define BLOCK 3 /* algo sparse: elements per block */
#define AG_RANK 5 /* value()'s rank id of an all-gather's vector, which every rank shares */

/* Rank r's element i: small integers (every partial sum exact in 16 bits) or random in [-1, 1). */
static float value(int random, int r, size_t i)
{
    return random ? (float)rand_value(r, i) : (float)((long)((i * 7 + (size_t)r * 13) % 17) - 8);
}

/* x rounded to the wire format and back. */
static float r16(dear_compress_t c, float x)
{
    return c == DEAR_COMPRESS_BF16 ? dear_bf16_to_float(dear_float_to_bf16(x)) : dear_half_to_float(dear_float_to_half(x));
}

/* Unit roundoff of the wire format. */
static double unit(dear_compress_t c) { return c == DEAR_COMPRESS_BF16 ? 0x1p-8 : 0x1p-11; }

typedef struct {
    dear_coll_op_t op;
    dear_coll_algo_t algo;
    dear_compress_t c, c_ag;
    int in_place, random;
    size_t count;
    double scale;
} case_t;

/* The algorithm that runs, and whether it composes its all-reduce (then its all-gather half has
 * its own format). */
static int composed(const case_t *k)
{
    dear_coll_algo_t a = k->algo;
    if (a == DEAR_ALGO_AUTO)
        a = dear_coll_select(k->op, k->count * 2, g_size, g_topo);
    return (dear_coll_algo_flags(a) & DEAR_ALGO_F_COMPOSED_AR) != 0;
}

/* Run case k on this rank's input in (its shard at off for an all-gather), in place or out of
 * place into recv; 1 (noted) when it fails. */
static int run_coll(const case_t *k, const float *in, float *recv, size_t off, int tag, dear_coll_info_t *info)
{
    size_t n = k->count;
    const void *send = NULL;
    if (k->in_place)
        memcpy(recv, in, n * sizeof(float));
    else
        send = k->op == DEAR_COLL_ALLGATHER ? (const void *)(in + off) : in;
    dear_coll_args_t a = { .op = k->op, .algo = k->algo, .dtype = DEAR_FLOAT32, .comm = g_comm, .net = g_net,
                           .tag = tag, .scale = k->scale, .sendbuf = send, .recvbuf = recv, .count = n,
                           .topo = g_topo, .sparse_block = BLOCK, .compress = k->c, .compress_ag = k->c_ag };
    dear_coll_req_t *req = NULL;
    int rc = dear_coll_start(&a, &req);
    if (rc == DEAR_OK)
        rc = dear_coll_wait(req);
    dear_coll_get_info(req, info);
    dear_coll_free(req);
    return note(rc != DEAR_OK, "%s %s %s/%s: %s", dear_coll_op_name(k->op), dear_coll_algo_name(k->algo),
                dear_compress_name(k->c), dear_compress_name(k->c_ag), dear_status_string(rc));
}

static int run_case(const case_t *k, size_t *sent)
{
    size_t n = k->count, off, len;
    dear_coll_shard(n, g_size, g_rank, &off, &len);
    int rs = k->op == DEAR_COLL_REDUCE_SCATTER, ag = k->op == DEAR_COLL_ALLGATHER;
    float *in = xmalloc(n * sizeof(float)), *recv = xmalloc(n * sizeof(float));
    double *mine = xmalloc(n * sizeof(double)), *sum = xmalloc(n * sizeof(double));
    double *mabs = xmalloc(n * sizeof(double)), *abssum = xmalloc(n * sizeof(double));
    /* An all-gather's vector is one owner's per element: every rank contributes its shard. */
    for (size_t i = 0; i < n; i++) {
        in[i] = value(k->random, ag ? AG_RANK : g_rank, i);
        int counted = !ag || (i >= off && i < off + len);
        mine[i] = counted ? in[i] : 0;
        mabs[i] = fabs(mine[i]);
    }
    MPI_Allreduce(mine, sum, (int)n, MPI_DOUBLE, MPI_SUM, g_comm);
    MPI_Allreduce(mabs, abssum, (int)n, MPI_DOUBLE, MPI_SUM, g_comm);
    dear_coll_info_t info = { 0 };
    int bad = run_coll(k, in, recv, off, 3, &info);
    if (sent != NULL)
        *sent = info.bytes_sent;
    size_t lo = rs ? off : 0, hi = rs ? off + len : n;
    const float *res = rs && !k->in_place ? recv - off : recv;
    int round_end = k->op == DEAR_COLL_ALLREDUCE && (k->c_ag != DEAR_COMPRESS_NONE || !composed(k));
    double scale = ag ? 1.0 : k->scale;
    /* Roundings on an element's path: at most P - 1 partial sums, the input, the result. */
    double bound = (g_size + 2) * unit(k->c);
    for (size_t i = lo; i < hi && !bad; i++) {
        float got = res[i], want;
        if (ag)
            want = r16(k->c, in[i]);
        else if (!k->random)
            want = round_end ? r16(k->c, (float)sum[i] * (float)scale) : (float)sum[i] * (float)scale;
        else
            want = (float)(sum[i] * scale);
        double tol = k->random && !ag ? bound * abssum[i] * scale + 1e-6 * fabs(want) : 0;
        bad = note(!(fabs((double)got - (double)want) <= tol),
                   "%s %s %s/%s %s count %zu %s: element %zu is %.9g, expected %.9g (within %.3g)",
                   dear_coll_op_name(k->op), dear_coll_algo_name(k->algo), dear_compress_name(k->c),
                   dear_compress_name(k->c_ag), k->in_place ? "in place" : "out of place", n,
                   k->random ? "random" : "integers", i, got, want, tol);
    }
    /* Two ranks, ring, direct and sparse: own float32 input plus the peer's rounded once. */
    if (!bad && rs && k->random && g_size == 2 && g_topo == NULL &&
        (k->algo == DEAR_ALGO_RING || k->algo == DEAR_ALGO_DIRECT || k->algo == DEAR_ALGO_SPARSE))
        for (size_t i = lo; i < hi && !bad; i++) {
            float want = (float)((float)((double)in[i] + (double)r16(k->c, value(1, 1 - g_rank, i))) * (float)k->scale);
            bad = note(res[i] != want, "reduce-scatter %s on 2 ranks: element %zu is %.9g, expected %.9g",
                       dear_coll_algo_name(k->algo), i, res[i], want);
        }
    if (!bad && k->op == DEAR_COLL_ALLREDUCE && k->algo != DEAR_ALGO_MPI && n > 0) {
        float *root = xmalloc(n * sizeof(float));
        memcpy(root, recv, n * sizeof(float));
        MPI_Bcast(root, (int)n, MPI_FLOAT, 0, g_comm);
        bad = note(memcmp(root, recv, n * sizeof(float)) != 0, "allreduce %s %s: result differs from rank 0's",
                   dear_coll_algo_name(k->algo), dear_compress_name(k->c));
        free(root);
    }
    free(in), free(recv), free(mine), free(sum), free(mabs), free(abssum);
    return bad;
}

/* The algorithms of the table that run on host memory; with hosts, hier and auto, and with
 * `sparse_on_hosts` sparse (its all-gather goes through partners there; int8 passes on from
 * its own slots, the 16-bit types are test_coll's). */
static int algo_list(dear_coll_algo_t *out, int sparse_on_hosts)
{
    int n = 0;
    for (int a = DEAR_ALGO_AUTO; a < DEAR_ALGO_COUNT; a++) {
        unsigned f = dear_coll_algo_flags((dear_coll_algo_t)a);
        if (f & DEAR_ALGO_F_NATIVE)
            continue;
        if (g_topo != NULL ? (a == DEAR_ALGO_AUTO || (f & DEAR_ALGO_F_NEEDS_HOSTS) ||
                              (sparse_on_hosts && a == DEAR_ALGO_SPARSE))
                           : !(f & DEAR_ALGO_F_NEEDS_HOSTS))
            out[n++] = (dear_coll_algo_t)a;
    }
    return n;
}

static void sweep(const char *what)
{
    size_t P = (size_t)g_size;
    const size_t counts[] = { 0, 1, P + 1, 1031, 40001 };
    dear_coll_algo_t algos[DEAR_ALGO_COUNT];
    int na = algo_list(algos, 0), bad = 0, ncases = 0;
    for (int a = 0; a < na; a++)
        for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
            for (int c = DEAR_COMPRESS_BF16; c <= DEAR_COMPRESS_FP16; c++)
                for (int ip = 0; ip < 2; ip++)
                    for (size_t ki = 0; ki < sizeof counts / sizeof counts[0]; ki++)
                        for (int random = 0; random < 2; random++) {
                            /* The all-gather half in float32: the all-reduces, in place, once. */
                            for (int cag = 0; cag < (op == DEAR_COLL_ALLREDUCE && ip ? 2 : 1); cag++) {
                                case_t k = { (dear_coll_op_t)op, algos[a], (dear_compress_t)c,
                                             cag ? DEAR_COMPRESS_NONE : (dear_compress_t)c, ip, random, counts[ki],
                                             1.0 / g_size };
                                bad |= run_case(&k, NULL);
                                ncases++;
                            }
                        }
    assert_all_ok(bad, what);
    if (g_rank == 0)
        fprintf(stderr, "%s: %d cases on %d ranks\n", what, ncases, g_size);
}

START_TEST(test_flat)
{
    sweep("flat");
}
END_TEST

static void int8_sweep(const char *what);
static void int8_feedback(const char *what);

/* hier over every layout of at least two hosts of at least two ranks (blocked), in 16 bits and
 * in int8. */
START_TEST(test_hier)
{
    int layouts = 0;
    for (int L = 2; L <= g_size / 2; L++) {
        if (g_size % L)
            continue;
        dear_coll_topo_t *t = NULL;
        ck_assert_int_eq(dear_coll_topo_create(g_comm, g_rank / L, &t), DEAR_OK);
        ck_assert_ptr_nonnull(t);
        g_topo = t;
        char what[64];
        snprintf(what, sizeof what, "hier %d x %d", g_size / L, L);
        sweep(what);
        strncat(what, ", int8", sizeof what - strlen(what) - 1);
        int8_sweep(what);
        int8_feedback(what);
        g_topo = NULL;
        dear_coll_topo_free(t, 0);
        layouts++;
    }
    if (g_rank == 0)
        fprintf(stderr, "hier: %d layout(s)\n", layouts);
}
END_TEST

/* Half the bytes on the wire: every dense algorithm sends, compressed, half what it sends
 * uncompressed (the same elements in 16 bits). */
START_TEST(test_bytes)
{
    dear_coll_algo_t algos[DEAR_ALGO_COUNT];
    int na = algo_list(algos, 0), bad = 0;
    for (int a = 0; a < na; a++)
        for (int op = 0; op < DEAR_COLL_OP_COUNT; op++) {
            if (algos[a] == DEAR_ALGO_SPARSE)
                continue; /* its messages carry indices too */
            size_t sent[2];
            for (int c = 0; c < 2; c++) {
                case_t k = { (dear_coll_op_t)op, algos[a], c ? DEAR_COMPRESS_BF16 : DEAR_COMPRESS_NONE,
                             c ? DEAR_COMPRESS_BF16 : DEAR_COMPRESS_NONE, 1, 1, 1031, 1.0 / g_size };
                if (c)
                    bad |= run_case(&k, &sent[c]);
                else {
                    /* uncompressed: only the byte count is of interest here */
                    float *v = xmalloc(1031 * sizeof(float));
                    for (size_t i = 0; i < 1031; i++)
                        v[i] = value(1, g_rank, i);
                    dear_coll_args_t ar = { .op = k.op, .algo = k.algo, .dtype = DEAR_FLOAT32, .comm = g_comm,
                                            .net = g_net, .tag = 6, .scale = k.scale, .recvbuf = v, .count = 1031,
                                            .sparse_block = BLOCK };
                    dear_coll_req_t *req = NULL;
                    int rc = dear_coll_start(&ar, &req);
                    if (rc == DEAR_OK)
                        rc = dear_coll_wait(req);
                    bad |= note(rc != DEAR_OK, "uncompressed %s: %s", dear_coll_op_name(k.op), dear_status_string(rc));
                    dear_coll_info_t info = { 0 };
                    dear_coll_get_info(req, &info);
                    sent[0] = info.bytes_sent;
                    dear_coll_free(req);
                    free(v);
                }
            }
            bad |= note(2 * sent[1] != sent[0], "%s %s: %zu bytes sent compressed, %zu uncompressed",
                        dear_coll_op_name((dear_coll_op_t)op), dear_coll_algo_name(algos[a]), sent[1], sent[0]);
        }
    assert_all_ok(bad, "bytes");
}
END_TEST

/* Multi-block reduce-scatter and all-gather (the runtime's pieces and groups): each block's
 * piece exact on integer data. */
START_TEST(test_blocks)
{
    enum { NB = 3 };
    const size_t cnt[NB] = { 17, 1000, 5 }, lo[NB] = { 2, 100, 0 }, hi[NB] = { 17, 731, 5 };
    float *buf[NB];
    dear_coll_block_t blk[NB];
    int bad = 0;
    for (int op = 0; op < 2; op++) {
        int ag = op == DEAR_COLL_ALLGATHER;
        for (int b = 0; b < NB; b++) {
            buf[b] = xmalloc(cnt[b] * sizeof(float));
            for (size_t i = 0; i < cnt[b]; i++)
                buf[b][i] = value(0, ag ? 2 : g_rank, i + 31 * (size_t)b);
            blk[b] = (dear_coll_block_t){ buf[b], cnt[b], lo[b], hi[b], NULL };
        }
        dear_coll_args_t a = { .op = (dear_coll_op_t)op, .algo = DEAR_ALGO_AUTO, .dtype = DEAR_FLOAT32,
                               .comm = g_comm, .net = g_net, .tag = 4, .scale = 1.0 / g_size, .nblocks = NB,
                               .blocks = blk, .compress = DEAR_COMPRESS_BF16 };
        dear_coll_req_t *req = NULL;
        int rc = dear_coll_start(&a, &req);
        if (rc == DEAR_OK)
            rc = dear_coll_wait(req);
        bad |= note(rc != DEAR_OK, "multi-block %s: %s", dear_coll_op_name(a.op), dear_status_string(rc));
        dear_coll_free(req);
        for (int b = 0; b < NB && !bad; b++) {
            size_t off, len;
            dear_coll_shard(cnt[b], g_size, g_rank, &off, &len);
            for (size_t i = lo[b]; i < hi[b] && !bad; i++) {
                if (!ag && (i < off || i >= off + len))
                    continue;
                double s = 0;
                for (int r = 0; r < g_size; r++)
                    s += value(0, r, i + 31 * (size_t)b);
                float want = ag ? r16(DEAR_COMPRESS_BF16, value(0, 2, i + 31 * (size_t)b))
                                : (float)s * (float)(1.0 / g_size);
                bad = note(buf[b][i] != want, "multi-block %s: block %d element %zu is %g, expected %g",
                           dear_coll_op_name(a.op), b, i, buf[b][i], want);
            }
        }
        for (int b = 0; b < NB; b++)
            free(buf[b]);
    }
    assert_all_ok(bad, "multi-block");
}
END_TEST

/* Types other than float32 travel as they are: a bfloat16 all-reduce with compress set is
 * bitwise the one without; and an unknown format is refused. */
START_TEST(test_other_types)
{
    size_t n = 1003;
    uint16_t *x = xmalloc(n * 2), *y = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++)
        x[i] = y[i] = dear_float_to_bf16(value(1, g_rank, i));
    int bad = 0;
    for (int c = 0; c < 2; c++) {
        dear_coll_args_t a = { .op = DEAR_COLL_ALLREDUCE, .dtype = DEAR_BFLOAT16, .comm = g_comm, .net = g_net,
                               .tag = 5, .scale = 1.0 / g_size, .recvbuf = c ? y : x, .count = n,
                               .compress = c ? DEAR_COMPRESS_FP16 : DEAR_COMPRESS_NONE };
        dear_coll_req_t *req = NULL;
        int rc = dear_coll_start(&a, &req);
        if (rc == DEAR_OK)
            rc = dear_coll_wait(req);
        bad |= note(rc != DEAR_OK, "bfloat16 all-reduce: %s", dear_status_string(rc));
        dear_coll_free(req);
    }
    bad |= note(memcmp(x, y, n * 2) != 0, "a bfloat16 all-reduce with compress set differs from one without");
    assert_all_ok(bad, "other types");
    float v[4] = { 0 };
    dear_coll_args_t a = { .op = DEAR_COLL_ALLREDUCE, .dtype = DEAR_FLOAT32, .comm = g_comm, .tag = 5,
                           .scale = 1.0, .recvbuf = v, .count = 4, .compress = (dear_compress_t)7 };
    dear_coll_req_t *req = NULL;
    ck_assert_int_eq(dear_coll_start(&a, &req), DEAR_ERR_ARG);
    ck_assert_ptr_null(req);
    /* int8 under DEAR_DETERMINISTIC: refused (a sum would depend on its owner) */
    setenv("DEAR_DETERMINISTIC", "1", 1);
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    a.compress = DEAR_COMPRESS_INT8;
    int rc = dear_coll_start(&a, &req);
    unsetenv("DEAR_DETERMINISTIC");
    ck_assert_int_eq(dear_params_load(), DEAR_OK);
    ck_assert_int_eq(rc, g_size > 1 ? DEAR_ERR_UNSUPPORTED : DEAR_OK);
    if (rc == DEAR_OK) {
        ck_assert_int_eq(dear_coll_wait(req), DEAR_OK);
        dear_coll_free(req);
    }
    free(x), free(y);
}
END_TEST

START_TEST(test_feedback_kernel)
{
    enum { N = 4099 };
    static float v[N], e[N], v2[N], e2[N];
    for (int c = DEAR_COMPRESS_BF16; c <= DEAR_COMPRESS_FP16; c++) {
        dear_dtype_t t = dear_compress_dtype((dear_compress_t)c);
        for (size_t i = 0; i < N; i++) {
            /* magnitudes from 2^-30 to 2^20: fp16's subnormals, flushes and overflows among them */
            v[i] = v2[i] = (float)ldexp(rand_value(0, i), (int)(i % 51) - 30);
            e[i] = e2[i] = (float)ldexp(rand_value(1, i), (int)(i % 51) - 40);
        }
        v[7] = v2[7] = INFINITY;
        v[8] = v2[8] = NAN;
        dear_reduce_feedback(t, v, e, N);
        for (size_t i = 0; i < N; i++)
            kern_feedback_at(t, v2, e2, i);
        for (size_t i = 0; i < N; i++) {
            float x = (float)ldexp(rand_value(0, i), (int)(i % 51) - 30) + (float)ldexp(rand_value(1, i), (int)(i % 51) - 40);
            ck_assert_msg(memcmp(&v[i], &v2[i], 4) == 0 && memcmp(&e[i], &e2[i], 4) == 0,
                          "%s element %zu: host %g %g, device body %g %g", dear_compress_name((dear_compress_t)c), i,
                          v[i], e[i], v2[i], e2[i]);
            if (i == 7 || i == 8) {
                ck_assert(e[i] == 0);
                continue;
            }
            if (isinf(v[i])) { /* fp16 overflow: the value travels as infinity, nothing is kept */
                ck_assert(e[i] == 0);
                continue;
            }
            ck_assert_msg(v[i] == r16((dear_compress_t)c, v[i]), "element %zu: %g is not exact in 16 bits", i, v[i]);
            ck_assert_msg(v[i] + e[i] == x, "element %zu: %g + %g is not %g", i, v[i], e[i], x);
        }
    }
}
END_TEST

/* int8 packing, the host's (reduce.c) and the device's (kern_body.h, as kernels.cu runs it: each
 * block's largest magnitude, then every element's code and residual): the same bytes and
 * residuals, with and without feedback, over a tail block, a zero block, an infinity's and a
 * NaN's; and the same values unpacked, set and added. */
START_TEST(test_q8_kernel)
{
    enum { N = 3 * DEAR_Q8_BLOCK + 77 };
    static float x[N], e[N], e2[N], d[N], d2[N];
    static char p[N + N], p2[N + N];
    for (int fb = 0; fb < 2; fb++) {
        for (size_t i = 0; i < N; i++) {
            x[i] = (float)ldexp(rand_value(0, i), (int)(i % 23) - 11);
            e[i] = e2[i] = fb ? (float)ldexp(rand_value(1, i), -12) : 0.0f;
        }
        for (size_t i = DEAR_Q8_BLOCK; i < 2 * DEAR_Q8_BLOCK; i++)
            x[i] = e[i] = e2[i] = 0.0f;
        x[2 * DEAR_Q8_BLOCK + 3] = INFINITY;
        x[N - 5] = NAN;
        size_t bytes = dear_q8_bytes(N);
        memset(p, 0x5a, sizeof p);
        memset(p2, 0x5a, sizeof p2);
        dear_reduce_q8_pack(p, x, fb ? e : NULL, N);
        float *ek = fb ? e2 : NULL;
        for (size_t b = 0; b < kern_q8_nblocks(N); b++) {
            size_t lo = b * DEAR_Q8_BLOCK, hi = lo + DEAR_Q8_BLOCK < N ? lo + DEAR_Q8_BLOCK : N;
            uint32_t m = 0;
            for (size_t i = lo; i < hi; i++)
                m = q8_mag(kern_q8_in_at(x, ek, i)) > m ? q8_mag(kern_q8_in_at(x, ek, i)) : m;
            float sc = q8_scale(bits_f(m));
            memcpy(p2 + b * sizeof(float), &sc, sizeof sc);
            for (size_t i = lo; i < hi; i++)
                kern_q8_code_at(p2, N, ek, i, kern_q8_in_at(x, ek, i), sc);
        }
        ck_assert_msg(memcmp(p, p2, bytes) == 0, "feedback %d: the device body packs other bytes", fb);
        ck_assert_msg(memcmp(e, e2, sizeof e) == 0, "feedback %d: the device body keeps other residuals", fb);
        for (int acc = 0; acc < 2; acc++) {
            for (size_t i = 0; i < N; i++)
                d[i] = d2[i] = (float)i;
            dear_reduce_q8_unpack(d, p, N, acc);
            for (size_t i = 0; i < N; i++)
                kern_q8_value_at(d2, p2, N, i, acc);
            ck_assert_msg(memcmp(d, d2, sizeof d) == 0, "feedback %d, acc %d: other values unpacked", fb, acc);
            if (!acc) /* a zero block arrives zero; an infinity's block, and a NaN's, arrive NaN */
                ck_assert(d[DEAR_Q8_BLOCK] == 0.0f && isnan(d[2 * DEAR_Q8_BLOCK]) && isnan(d[N - 5]));
        }
    }
}
END_TEST

/* Rank p's element i of an int8 case: value()'s, but under algo sparse only every 8th block of
 * BLOCK elements is non-zero (a different one per rank), so that sparse messages pay. */
static float q8_value(const case_t *k, int p, size_t i)
{
    return k->algo == DEAR_ALGO_SPARSE && (i / BLOCK + (size_t)p) % 8 != 0 ? 0.0f : value(k->random, p, i);
}

/* int8: the largest magnitude, in float64, of rank p's (or of the float64 sum's, p < 0) values in
 * the int8 block of each element: blocks of DEAR_COMPRESS_INT8_BLOCK from the start of each shard;
 * under algo sparse the whole shard (its blocks start at each non-zero block, or at the shard for
 * a dense message). Row p + 1 of the table, for p from -1 to AG_RANK at least, element i at
 * column i; built once per case, since the bound asks for every element and peer. */
static int q8_amax_rows(void) { return (g_size > AG_RANK + 1 ? g_size : AG_RANK + 1) + 1; }

static double *q8_block_amax_table(const case_t *k, const double *sum)
{
    size_t n = k->count;
    int rows = q8_amax_rows();
    double *t = xmalloc((size_t)rows * (n ? n : 1) * sizeof(double));
    for (int o = 0; o < g_size; o++) {
        size_t off, len;
        dear_coll_shard(n, g_size, o, &off, &len);
        size_t step = k->algo == DEAR_ALGO_SPARSE ? len : DEAR_COMPRESS_INT8_BLOCK;
        for (size_t lo = off; lo < off + len; lo += step) {
            size_t hi = lo + step < off + len ? lo + step : off + len;
            for (int p = -1; p < rows - 1; p++) {
                double m = 0;
                for (size_t j = lo; j < hi; j++)
                    m = fmax(m, fabs(p < 0 ? sum[j] : (double)q8_value(k, p, j)));
                for (size_t j = lo; j < hi; j++)
                    t[(size_t)(p + 1) * n + j] = m;
            }
        }
    }
    return t;
}

static double q8_block_amax(const double *table, int p, size_t n, size_t i) { return table[(size_t)(p + 1) * n + i]; }

/* Owner of element i of n. */
static int q8_owner(size_t n, size_t i)
{
    for (int o = 0; o < g_size; o++) {
        size_t off, len;
        dear_coll_shard(n, g_size, o, &off, &len);
        if (i >= off && i < off + len)
            return o;
    }
    return -1;
}

/* hier runs case k (int8): asked for, or picked by auto at int8's bytes. */
static int q8_hier(const case_t *k)
{
    if (g_topo == NULL || g_size < 2 || k->algo == DEAR_ALGO_SPARSE)
        return 0;
    size_t bytes = (size_t)((double)(k->count * sizeof(float)) * dear_compress_ratio(DEAR_COMPRESS_INT8));
    return k->algo == DEAR_ALGO_HIER ||
           (k->algo == DEAR_ALGO_AUTO && dear_coll_select(k->op, bytes, g_size, g_topo) == DEAR_ALGO_HIER);
}

/* hier's layout (coll_hier.c): host and local index of rank p, and the count of p's chunk. */
static int q8_host_of(int p) { return p / g_topo->local_size; }

static size_t q8_count(size_t n, int p)
{
    size_t off, len;
    dear_coll_shard(n, g_size, p, &off, &len);
    return len;
}

/* hier's segments of a vector of n float32 and the packed bytes of a chunk of c elements cut
 * into them (blocks start at each piece). */
static int q8_nseg(size_t n)
{
    size_t seg = (size_t)dear_param_int(DEAR_P_COLL_SEGMENT) / sizeof(float) * (size_t)g_size, most = 0;
    for (int p = 0; p < g_size; p++)
        most = q8_count(n, p) > most ? q8_count(n, p) : most;
    size_t ns = (n + seg - 1) / seg;
    ns = ns < most ? ns : most;
    return ns < 1 ? 1 : (int)ns;
}

static size_t q8_pieces_bytes(size_t c, int nseg)
{
    size_t b = 0, off, len;
    for (int k = 0; k < nseg; k++) {
        dear_coll_shard(c, nseg, k, &off, &len);
        b += dear_q8_bytes(len);
    }
    return b;
}

/* The chunk rank me holds of host g != its own: its column's, or with two hosts the shifted
 * partner's (the one it sends to in the reduce-scatter, receives from in the all-gather). */
static int q8_held(int ag, int g)
{
    int L = g_topo->local_size, h = g_topo->host, l = g_topo->local;
    const int *ro = g_topo->rank_of;
    if (g_topo->nhosts != 2)
        return ro[g * L + l];
    if (ag)
        return h == 0 ? ro[L + l] : ro[(l + 1) % L];
    return h == 0 ? ro[L + (l + L - 1) % L] : ro[l];
}

/* The bytes an int8 phase of hier sends from this rank: inside the host float32, the other local
 * ranks' pieces of every chunk this rank does not hold (reduce-scatter) or of every chunk it
 * holds (all-gather); across, the packed pieces of its held chunks (reduce-scatter) or of its
 * own to every other host (all-gather). */
static size_t q8_hier_bytes(int ag, size_t n)
{
    int H = g_topo->nhosts, L = g_topo->local_size, nseg = q8_nseg(n);
    size_t held = q8_count(n, g_rank), across = 0;
    for (int g = 0; g < H; g++) {
        if (g == g_topo->host)
            continue;
        held += q8_count(n, q8_held(ag, g));
        across += q8_pieces_bytes(ag ? q8_count(n, g_rank) : q8_count(n, q8_held(0, g)), nseg);
    }
    if (ag)
        return held * (size_t)(L - 1) * sizeof(float) + across;
    return (n - held) * sizeof(float) + across;
}

/* hier int8: the largest magnitude over each owner's shard of each host's partial sum (am[o * H +
 * g]), of the all-gather's values (ag[o]) and of the float64 sum (sum[o]): blocks lie within
 * pieces of the shard, so these bound every block's. */
typedef struct {
    double *am, *ag, *sum;
} q8_shard_amax_t;

static void q8_shard_amax(const case_t *k, const double *sum, q8_shard_amax_t *m)
{
    int H = g_topo->nhosts;
    m->am = xmalloc((size_t)(g_size * H) * sizeof(double));
    m->ag = xmalloc((size_t)g_size * sizeof(double));
    m->sum = xmalloc((size_t)g_size * sizeof(double));
    for (int o = 0; o < g_size; o++) {
        size_t off, len;
        dear_coll_shard(k->count, g_size, o, &off, &len);
        m->ag[o] = m->sum[o] = 0;
        for (int g = 0; g < H; g++)
            m->am[o * H + g] = 0;
        for (size_t j = off; j < off + len; j++) {
            m->ag[o] = fmax(m->ag[o], fabs(value(k->random, AG_RANK, j)));
            m->sum[o] = fmax(m->sum[o], fabs(sum[j]));
            for (int g = 0; g < H; g++) {
                double hs = 0;
                for (int l = 0; l < g_topo->local_size; l++)
                    hs += value(k->random, g_topo->rank_of[g * g_topo->local_size + l], j);
                m->am[o * H + g] = fmax(m->am[o * H + g], fabs(hs));
            }
        }
    }
}

static void q8_shard_amax_free(q8_shard_amax_t *m)
{
    free(m->am), free(m->ag), free(m->sum);
}

/* The float64 error bound of element i after op in int8 (all-gather half in c_ag): half a scale
 * for each peer's quantized input (its owner's own input travels unquantized), times the
 * scale; an int8 all-gather adds half a scale of the averaged shard (a bf16 one half its unit).
 * 1e-5 of the magnitudes covers float32's own roundings. */
static double q8_bound(const case_t *k, const double *sum, const double *abssum, const q8_shard_amax_t *hm,
                       const double *amax, size_t i)
{
    size_t n = k->count;
    int ag = k->op == DEAR_COLL_ALLGATHER, o = q8_owner(n, i), H = hm ? g_topo->nhosts : 0;
    if (ag)
        return (hm ? hm->ag[o] : q8_block_amax(amax, AG_RANK, n, i)) / 254.0;
    double rs = 0;
    if (hm)
        for (int g = 0; g < H; g++)
            rs += g == q8_host_of(o) ? 0 : hm->am[o * H + g] / 254.0;
    else
        for (int p = 0; p < g_size; p++)
            rs += p == o ? 0 : q8_block_amax(amax, p, n, i) / 254.0;
    double b = rs * k->scale + 1e-5 * abssum[i] * k->scale;
    if (k->op == DEAR_COLL_ALLREDUCE && k->c_ag == DEAR_COMPRESS_INT8)
        b += ((hm ? hm->sum[o] : q8_block_amax(amax, -1, n, i)) * k->scale + rs * k->scale) / 254.0 *
             (1 + 1e-5);
    else if (k->op == DEAR_COLL_ALLREDUCE && k->c_ag == DEAR_COMPRESS_BF16)
        b += fabs(sum[i] * k->scale) * 0x1p-8 + rs * k->scale * 0x1p-8;
    return b;
}

/* One int8 case: the error of every element against the float64 reference, the same bits on
 * every rank after an all-reduce or an all-gather, and the bytes sent. */
static int q8_case(const case_t *k)
{
    size_t n = k->count, off, len;
    dear_coll_shard(n, g_size, g_rank, &off, &len);
    int rs = k->op == DEAR_COLL_REDUCE_SCATTER, ag = k->op == DEAR_COLL_ALLGATHER;
    float *in = xmalloc(n * sizeof(float)), *recv = xmalloc(n * sizeof(float));
    double *sum = xmalloc(n * sizeof(double)), *abssum = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        in[i] = q8_value(k, ag ? AG_RANK : g_rank, i);
        sum[i] = abssum[i] = 0;
        for (int p = 0; p < g_size; p++) {
            sum[i] += q8_value(k, ag ? AG_RANK : p, i) * (ag ? 0 : 1);
            abssum[i] += fabs(q8_value(k, ag ? AG_RANK : p, i));
        }
    }
    dear_coll_info_t info = { 0 };
    int bad = run_coll(k, in, recv, off, 7, &info);
    int sparse = k->algo == DEAR_ALGO_SPARSE, hier = q8_hier(k);
    q8_shard_amax_t hm = { 0 };
    double *amax = NULL;
    if (hier)
        q8_shard_amax(k, sum, &hm);
    else if (g_size > 1)
        amax = q8_block_amax_table(k, sum);
    if (!bad && sparse) {
        /* its values packed: never more than direct's bytes, and sparse messages on the large
         * vectors, whose shards have many blocks (one in 8 non-zero) */
        size_t direct = 0, pl, po;
        for (int p = 0; p < g_size; p++) {
            dear_coll_shard(n, g_size, p, &po, &pl);
            direct += p != g_rank && !ag ? dear_q8_bytes(pl) : 0;
        }
        direct += rs ? 0 : (size_t)(g_size - 1) * dear_q8_bytes(len);
        /* On hosts the all-gather passes other ranks' messages on (through partners): each still
         * travels P-1 times, so only the sum over the ranks is bounded. */
        unsigned long long sent = info.bytes_sent, bound = direct;
        if (g_topo != NULL) {
            unsigned long long mine[2] = { sent, bound }, all[2];
            MPI_Allreduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, g_comm);
            sent = all[0], bound = all[1];
        }
        bad = note(info.algo != DEAR_ALGO_SPARSE || sent > bound ||
                       (g_size > 1 && n > 10000 && info.msgs_sparse == 0),
                   "int8 %s asked for sparse ran %s and sent %llu bytes (direct's: %llu)%s, %zu sparse message(s)",
                   dear_coll_op_name(k->op), dear_coll_algo_name(info.algo), sent, bound,
                   g_topo ? " over all ranks" : "", info.msgs_sparse);
    } else if (!bad && hier) {
        /* an all-reduce is the two phases in turn; bytes checked where both are int8 */
        int both = !rs && (ag || k->c_ag == DEAR_COMPRESS_INT8);
        size_t want = (ag ? 0 : q8_hier_bytes(0, n)) + (both ? q8_hier_bytes(1, n) : 0);
        bad = note(info.algo != DEAR_ALGO_HIER || ((rs || both) && info.bytes_sent != want),
                   "int8 %s asked for %s ran %s and sent %zu bytes, expected hier and %zu", dear_coll_op_name(k->op),
                   dear_coll_algo_name(k->algo), dear_coll_algo_name(info.algo), info.bytes_sent, want);
    } else if (!bad && g_size > 1) {
        /* direct: each chunk for its owner (reduce-scatter), this rank's shard for every peer */
        size_t want = 0, pl, po;
        for (int p = 0; p < g_size; p++) {
            dear_coll_shard(n, g_size, p, &po, &pl);
            if (p != g_rank && !ag)
                want += dear_q8_bytes(pl);
        }
        if (!rs)
            want += (size_t)(g_size - 1) * (ag || k->c_ag == DEAR_COMPRESS_INT8 ? dear_q8_bytes(len)
                                            : len * (k->c_ag == DEAR_COMPRESS_BF16 ? 2 : 4));
        bad = note(info.algo != DEAR_ALGO_DIRECT || info.bytes_sent != want,
                   "int8 %s asked for %s ran %s and sent %zu bytes, expected direct and %zu", dear_coll_op_name(k->op),
                   dear_coll_algo_name(k->algo), dear_coll_algo_name(info.algo), info.bytes_sent, want);
    }
    size_t lo = rs ? off : 0, hi = rs ? off + len : n;
    const float *res = rs && !k->in_place ? recv - off : recv;
    for (size_t i = lo; i < hi && !bad; i++) {
        double want = ag ? in[i] : sum[i] * k->scale;
        double tol = g_size > 1 ? q8_bound(k, sum, abssum, hier ? &hm : NULL, amax, i) : 0;
        bad = note(!(fabs((double)res[i] - want) <= tol),
                   "int8 %s %s ag %s %s count %zu %s: element %zu is %.9g, expected %.9g (within %.3g)",
                   dear_coll_op_name(k->op), dear_coll_algo_name(k->algo), dear_compress_name(k->c_ag),
                   k->in_place ? "in place" : "out of place", n, k->random ? "random" : "integers", i, res[i], want,
                   tol);
    }
    int anybad = bad; /* every rank decides alike whether to compare, or a failure on one would hang */
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, g_comm);
    if (!anybad && !rs && n > 0) {
        float *root = xmalloc(n * sizeof(float));
        memcpy(root, recv, n * sizeof(float));
        MPI_Bcast(root, (int)n, MPI_FLOAT, 0, g_comm);
        bad = note(memcmp(root, recv, n * sizeof(float)) != 0, "int8 %s %s: result differs from rank 0's",
                   dear_coll_op_name(k->op), dear_coll_algo_name(k->algo));
        free(root);
    }
    if (hier)
        q8_shard_amax_free(&hm);
    free(amax), free(in), free(recv), free(sum), free(abssum);
    return bad;
}

static void int8_sweep(const char *what)
{
    size_t P = (size_t)g_size;
    const size_t counts[] = { 0, 1, P + 1, 1031, 40001 };
    const dear_compress_t ags[] = { DEAR_COMPRESS_INT8, DEAR_COMPRESS_BF16, DEAR_COMPRESS_NONE };
    dear_coll_algo_t algos[DEAR_ALGO_COUNT];
    int na = algo_list(algos, 1), bad = 0, ncases = 0;
    for (int a = 0; a < na; a++)
        for (int op = 0; op < DEAR_COLL_OP_COUNT; op++)
            for (int ip = 0; ip < 2; ip++)
                for (size_t ki = 0; ki < sizeof counts / sizeof counts[0]; ki++)
                    for (int random = 0; random < 2; random++)
                        for (int g = 0; g < (op == DEAR_COLL_ALLREDUCE && algos[a] != DEAR_ALGO_SPARSE ? 3 : 1);
                             g++) {
                            case_t k = { (dear_coll_op_t)op, algos[a], DEAR_COMPRESS_INT8, ags[g], ip, random,
                                         counts[ki], 1.0 / g_size };
                            bad |= q8_case(&k);
                            ncases++;
                        }
    assert_all_ok(bad, what);
    if (g_rank == 0)
        fprintf(stderr, "%s: %d cases on %d ranks\n", what, ncases, g_size);
}

START_TEST(test_int8)
{
    int8_sweep("int8");
}
END_TEST

/* Error feedback: T all-reduces of the same gradients. With it, the sum of the T results stays
 * within two all-reduces' error of T times the average (each quantization's residual is carried,
 * not repeated); without it the same error repeats T times. Once as one vector, once as three
 * blocks of a multi-block reduce-scatter then all-gather (the runtime's pieces and groups). */
static double q8_feedback_error(int with_ef, int blocks, size_t n, int T)
{
    float *g = xmalloc(n * sizeof(float)), *v = xmalloc(n * sizeof(float)), *ef = xmalloc(n * sizeof(float));
    double *acc = xmalloc(n * sizeof(double)), *avg = xmalloc(n * sizeof(double)), *mine = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        g[i] = value(1, g_rank, i);
        mine[i] = g[i];
        acc[i] = 0;
        ef[i] = 0;
    }
    MPI_Allreduce(mine, avg, (int)n, MPI_DOUBLE, MPI_SUM, g_comm);
    int bad = 0;
    for (int t = 0; t < T && !bad; t++) {
        memcpy(v, g, n * sizeof(float));
        for (int ph = 0; ph < (blocks ? 2 : 1); ph++) {
            /* three blocks over the vector, each its own sharded vector */
            size_t cut[4] = { 0, n / 5, n / 5 + n / 3, n };
            dear_coll_block_t blk[3];
            for (int b = 0; b < 3; b++)
                blk[b] = (dear_coll_block_t){ v + cut[b], cut[b + 1] - cut[b], 0, cut[b + 1] - cut[b],
                                              with_ef ? ef + cut[b] : NULL };
            dear_coll_args_t a = { .op = blocks ? (ph ? DEAR_COLL_ALLGATHER : DEAR_COLL_REDUCE_SCATTER)
                                                : DEAR_COLL_ALLREDUCE,
                                   .algo = g_topo != NULL ? DEAR_ALGO_HIER : DEAR_ALGO_AUTO, .topo = g_topo,
                                   .dtype = DEAR_FLOAT32, .comm = g_comm, .net = g_net, .tag = 8, .scale = 1.0 / g_size,
                                   .recvbuf = v, .count = n, .compress = DEAR_COMPRESS_INT8,
                                   .compress_ag = DEAR_COMPRESS_INT8, .ef = with_ef ? ef : NULL,
                                   .nblocks = blocks ? 3 : 0, .blocks = blocks ? blk : NULL };
            dear_coll_req_t *req = NULL;
            int rc = dear_coll_start(&a, &req);
            if (rc == DEAR_OK)
                rc = dear_coll_wait(req);
            bad |= note(rc != DEAR_OK, "int8 feedback: %s", dear_status_string(rc));
            dear_coll_free(req);
        }
        for (size_t i = 0; i < n; i++)
            acc[i] += v[i];
    }
    double worst = 0;
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(acc[i] - T * avg[i] / g_size));
    assert_all_ok(bad, "int8 feedback");
    free(g), free(v), free(ef), free(acc), free(avg), free(mine);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, g_comm);
    return worst;
}

/* Flat, or under hier with g_topo. */
static void int8_feedback(const char *what)
{
    if (g_size < 2)
        return;
    enum { N = 3001, T = 30 };
    /* one all-reduce's bound: values in [-1, 1), P - 1 peers' half scales and the shard's (under
     * hier H - 1 hosts' partial sums of L values each, no more) */
    double one = (g_size - 1) / 254.0 / g_size + 1.0 / 254.0;
    for (int blocks = 0; blocks < 2; blocks++) {
        double with = q8_feedback_error(1, blocks, N, T), without = q8_feedback_error(0, blocks, N, T);
        if (g_rank == 0)
            fprintf(stderr, "%s %s: %d iterations' error %.3g with feedback, %.3g without (one: %.3g)\n", what,
                    blocks ? "multi-block" : "all-reduce", T, with, without, one);
        ck_assert_msg(with <= 2 * one, "%s: with feedback the error of %d iterations is %.3g > %.3g", what, T, with,
                      2 * one);
        ck_assert_msg(without > 4 * with, "%s: without feedback the error of %d iterations is %.3g, with %.3g", what, T,
                      without, with);
    }
}

START_TEST(test_int8_feedback)
{
    int8_feedback("int8");
}
END_TEST

int main(int argc, char **argv)
{
    int socket = 0;
    for (int i = 1; i < argc; i++)
        socket |= strcmp(argv[i], "--socket") == 0;
    /* Small ring segments: the larger counts run as many segments per chunk. */
    setenv("DEAR_COLL_SEGMENT", "4096", 1);
    coll_test_init(&argc, &argv, socket);
    Suite *s = suite_create("compress");
    TCase *tc = tcase_create("compress");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_feedback_kernel);
    tcase_add_test(tc, test_q8_kernel);
    tcase_add_test(tc, test_other_types);
    tcase_add_test(tc, test_flat);
    tcase_add_test(tc, test_blocks);
    tcase_add_test(tc, test_bytes);
    tcase_add_test(tc, test_int8);
    tcase_add_test(tc, test_int8_feedback);
    if (!socket)
        tcase_add_test(tc, test_hier);
    suite_add_tcase(s, tc);
    return coll_test_run(s);
}
